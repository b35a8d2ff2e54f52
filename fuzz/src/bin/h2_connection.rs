//! afl.rs target: see `watchproxy::api::http2_fuzz::connection`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::api::http2_fuzz::connection(data);
    });
}
