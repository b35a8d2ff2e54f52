//! The client CA in force. A connection's certificate is verified at its
//! handshake, by the CA of then; once the CA file is read again, the
//! certificates of open connections are judged by the CA now in it, so
//! that a CA taken out of the file ends what its certificates opened.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};

/// Verdicts kept for the CA in force, at most: each a certificate seen
/// since it changed.
const VERDICTS: usize = 4096;

#[derive(Default)]
pub struct ClientCa {
    /// Whether it changed since the start: until it does, every
    /// handshake's verdict stands and nothing is verified again.
    changed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// By the SHA-256 of a chain's first certificate.
    verdicts: HashMap<[u8; 32], bool>,
}

impl ClientCa {
    /// The CA the handshakes verify with from now on; `replaces`: it takes
    /// the place of one in force, whose certificates are judged again.
    pub fn set(&self, verifier: Option<Arc<dyn ClientCertVerifier>>, replaces: bool) {
        let mut state = self.state.lock();
        state.verifier = verifier;
        state.verdicts.clear();
        if replaces {
            self.changed.store(true, Ordering::Release);
        }
    }

    /// Whether `chain`, verified at its connection's handshake, verifies
    /// by the CA in force now.
    pub fn verifies(&self, chain: &[CertificateDer<'static>]) -> bool {
        if !self.changed.load(Ordering::Acquire) {
            return true;
        }
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, leaf);
        let key: [u8; 32] = digest.as_ref().try_into().expect("SHA-256 is 32 bytes");
        // Verified under the lock: only a certificate first seen since the
        // CA changed, once.
        let mut state = self.state.lock();
        if let Some(&verdict) = state.verdicts.get(&key) {
            return verdict;
        }
        let verdict = (state.verifier.as_ref()).is_some_and(|v| {
            v.verify_client_cert(leaf, intermediates, UnixTime::now())
                .is_ok()
        });
        if state.verdicts.len() >= VERDICTS {
            state.verdicts.clear();
        }
        state.verdicts.insert(key, verdict);
        verdict
    }
}
