//! afl.rs target: see `watchproxy::server::http2_fuzz::header_block`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::server::http2_fuzz::header_block(data);
    });
}
