//! Dispatches M events to N node-pinned watchers (one interested per event);
//! run under `valgrind --tool=cachegrind` by `bench/dispatch-icount.sh`
//! to count instructions per event, which do not depend on machine noise.

use std::sync::Arc;
use std::time::Duration;
use watchproxy::dispatch::{Dispatcher, Inbox, Trigger};
use watchproxy::object::{Event, Resource};
use watchproxy::selector::Predicate;
use watchproxy::telemetry::Metrics;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: dispatch_icount WATCHERS EVENTS"))
        .collect();
    let (watchers, events_n) = (args[0], args[1]);
    let node = ["spec.nodeName"];
    let r = Resource::namespaced_json("pods", "/registry/pods", &node, &node);
    let d = Arc::new(Dispatcher::new(
        64,
        Duration::from_secs(3600),
        Metrics::default().resource("pods"),
    ));
    let subs: Vec<_> = (0..watchers)
        .map(|n| {
            let p = Predicate::new(&r, "", "", "", &format!("spec.nodeName=node-{n}")).unwrap();
            d.register(
                &Inbox::solo(),
                p,
                Trigger::Field {
                    field: 0,
                    value: format!("node-{n}"),
                },
                0,
                false,
                false,
            )
        })
        .collect();
    let events: Vec<Arc<Event>> = (0..watchers)
        .map(|n| {
            let v = format!(r#"{{"spec":{{"nodeName":"node-{n}"}}}}"#);
            let o = |rev| {
                Arc::new(
                    r.decode(
                        format!("/registry/pods/ns/p{n}").as_bytes(),
                        v.as_bytes(),
                        rev,
                    )
                    .unwrap(),
                )
            };
            Arc::new(Event::modified(2, o(2), o(1)))
        })
        .collect();
    // Touch each watcher once so first-use costs are out of the way.
    for n in 0..watchers {
        d.dispatch(std::slice::from_ref(&events[n]));
        subs[n].mailbox.try_recv().unwrap();
    }
    let mut x = 0u64;
    for i in 0..events_n {
        let n = (i * 7919) % watchers;
        d.dispatch(std::slice::from_ref(&events[n]));
        if subs[n].mailbox.try_recv().is_some() {
            x += 1;
        }
    }
    assert_eq!(x as usize, events_n);
}
