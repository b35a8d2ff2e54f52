//! afl.rs target: see `watchproxy::api::http2_fuzz::grpc_framing`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::api::http2_fuzz::grpc_framing(data);
    });
}
