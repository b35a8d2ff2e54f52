//! afl.rs target: see `watchproxy::server::http2_fuzz::connection`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::server::http2_fuzz::connection(data);
    });
}
