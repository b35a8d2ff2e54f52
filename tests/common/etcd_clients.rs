//! etcd's own clients against watchproxy's etcd API: a watchproxy that
//! answers them, and what their responses show, field for field.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchResponse, WatchStream};
use watchproxy::config::Config;

use super::Proxy;

/// watchproxy serving `config`, and an etcd client of it once its caches
/// of pods and nodes answer.
pub async fn etcd_api_proxy(config: Config) -> (Proxy, Client) {
    let proxy = Proxy::start_config(config).await;
    let mut client = Client::connect([format!("http://{}", proxy.addr)], None)
        .await
        .unwrap();
    let mut last = None;
    for _ in 0..100 {
        let pods = client
            .get("/registry/pods/", Some(GetOptions::new().with_prefix()))
            .await;
        let nodes = client
            .get("/registry/minions/", Some(GetOptions::new().with_prefix()))
            .await;
        match pods.and(nodes) {
            Ok(_) => return (proxy, client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("watchproxy's etcd API did not answer within 10 s: {last:?}");
}

/// A pair as every field of it reads.
pub type Kv = (String, i64, i64, i64, String, i64);

pub fn kv(kv: &KeyValue) -> Kv {
    (
        kv.key_str().unwrap().to_owned(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.value_str().unwrap().to_owned(),
        kv.lease(),
    )
}

/// An event as it reads: (0 for a PUT, 1 for a DELETE), its pair, the
/// pair before.
pub type Ev = (i32, Kv, Option<Kv>);

/// Every event of `stream` until one at `until` or later, as it reads,
/// and whether a revision was ever split between two responses.
pub async fn events_until(stream: &mut WatchStream, until: i64) -> (Vec<Ev>, bool) {
    let (events, split) = watch_events_until(stream, until).await;
    (events.into_iter().map(|(_, e)| e).collect(), split)
}

/// [`events_until`], each event with the id of the watch it came for.
pub async fn watch_events_until(stream: &mut WatchStream, until: i64) -> (Vec<(i64, Ev)>, bool) {
    let mut events: Vec<(i64, Ev)> = Vec::new();
    let mut last_revision_of_a_response = 0;
    let mut split = false;
    while events.last().is_none_or(|(_, (_, kv, _))| kv.2 < until) {
        let r: WatchResponse = tokio::time::timeout(Duration::from_secs(15), stream.message())
            .await
            .expect("events within 15 s")
            .unwrap()
            .expect("the stream is open");
        assert!(!r.canceled(), "{r:?}");
        let first = r.events().first().map(|e| e.kv().unwrap().mod_revision());
        split |= first.is_some() && first == Some(last_revision_of_a_response);
        for e in r.events() {
            let kind = matches!(e.event_type(), EventType::Delete) as i32;
            let ev = (kind, kv(e.kv().unwrap()), e.prev_kv().map(kv));
            events.push((r.watch_id(), ev));
        }
        if let Some(e) = r.events().last() {
            last_revision_of_a_response = e.kv().unwrap().mod_revision();
        }
    }
    (events, split)
}

/// The next response of `stream`, which must be a watch's creation.
pub async fn created(stream: &mut WatchStream) -> WatchResponse {
    let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("created within 10 s")
        .unwrap()
        .unwrap();
    assert!(r.created(), "{r:?}");
    r
}
