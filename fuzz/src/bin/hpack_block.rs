//! afl.rs target: see `watchproxy::api::http2_fuzz::header_block`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::api::http2_fuzz::header_block(data);
    });
}
