//! afl.rs target: see `watchproxy::server::http2_fuzz::grpc_framing`.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        watchproxy::server::http2_fuzz::grpc_framing(data);
    });
}
