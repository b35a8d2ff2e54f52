//! Authorization for a stream's whole life, end to end on both serve
//! paths: a watch whose JWT or client certificate expires ends with
//! CREDENTIAL_EXPIRED, one whose token or signing key leaves its file with
//! CREDENTIAL_REVOKED, one a narrowed rule no longer allows with
//! ACCESS_CHANGED; each names the version from which a fresh credential
//! resumes with no gap and no repeat. The configuration file is read again
//! on a change and on SIGHUP; one that does not validate is refused whole.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use tonic::transport::Channel;
use tonic::Code;
use watchproxy::config::{Config, ServePath};
use watchproxy::pb::watch_proxy_client::WatchProxyClient;
use watchproxy::pb::{self, WatchEvent};

/// The pods configuration on `path`, with `extra` (auth and rules) after
/// it.
pub(crate) fn config_text(etcd: &Etcd, path: ServePath, extra: &str) -> String {
    let serve = match path {
        ServePath::Fast => "fast",
        ServePath::Tonic => "tonic",
    };
    pods_yaml(&etcd.client_url, 64)
        .replace(
            "  watcher_queue: 64",
            &format!("  watcher_queue: 64\n  serve_path: {serve}"),
        )
        .replace("resources:", "etcd_api: {enabled: true}\nresources:")
        + extra
}

/// Started from a file, so that it reads the file again.
pub(crate) async fn start_from(file: &Path) -> Proxy {
    Proxy::start_config(Config::from_file(file).unwrap()).await
}

pub(crate) fn watch_from(namespace: &str, rv: u64) -> pb::WatchRequest {
    pb::WatchRequest {
        namespace: namespace.into(),
        ..watch_req("pods", &rv.to_string())
    }
}

pub(crate) async fn list_as(
    client: &mut WatchProxyClient<Channel>,
    token: &str,
) -> Result<u64, tonic::Status> {
    let req = pb::ListRequest {
        resource: "pods".into(),
        namespace: "ns".into(),
        ..Default::default()
    };
    let r = client.list(as_caller(token, req)).await?.into_inner();
    Ok(r.resource_version.parse().unwrap())
}

/// The version of a List as `token`, once the cache is ready.
async fn ready_version(client: &mut WatchProxyClient<Channel>, token: &str) -> u64 {
    for _ in 0..200 {
        if let Ok(v) = list_as(client, token).await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("pods did not become ready");
}

/// The reason and resume version an ended watch's status names.
pub(crate) fn reason_and_resume(status: &tonic::Status) -> (String, Option<u64>) {
    let info = tonic_types::StatusExt::get_error_details(status)
        .error_info()
        .cloned()
        .expect("an ErrorInfo");
    let resume = (info.metadata.get("resume_resource_version")).map(|v| v.parse().unwrap());
    if let Some(r) = resume {
        assert_eq!(resume_version(status), r, "metadata and ErrorInfo agree");
    }
    (info.reason, resume)
}

/// Reads `stream` until it ends with an error within `within`: the error,
/// when it came, and the (name, version) of each event before it.
pub(crate) async fn read_until_end(
    stream: &mut tonic::Streaming<WatchEvent>,
    within: Duration,
) -> (tonic::Status, SystemTime, Vec<(String, u64)>) {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| panic!("the watch did not end within {within:?}; saw {seen:?}"));
        match next {
            Ok(Some(e)) => {
                let o = e.object.as_ref().unwrap();
                seen.push((o.name.clone(), summary(&e).2));
            }
            Ok(None) => panic!("the watch ended with OK"),
            Err(status) => return (status, SystemTime::now(), seen),
        }
    }
}

/// Reads `stream` until it shows version `last`.
async fn read_through(stream: &mut tonic::Streaming<WatchEvent>, last: u64) -> Vec<(String, u64)> {
    let mut seen = Vec::new();
    while seen.last().is_none_or(|(_, v)| *v < last) {
        let e = next_event(stream)
            .await
            .unwrap()
            .expect("the watch goes on");
        let o = e.object.as_ref().unwrap();
        seen.push((o.name.clone(), summary(&e).2));
    }
    seen
}

/// Puts a pod in `ns` every 100 ms for `for_`, returning (name, revision)
/// of each.
fn write_for(
    etcd: &Etcd,
    ns: &'static str,
    for_: Duration,
) -> tokio::task::JoinHandle<Vec<(String, u64)>> {
    let url = etcd.client_url.clone();
    tokio::spawn(async move {
        let mut c = etcd_client::Client::connect([url], None).await.unwrap();
        let started = Instant::now();
        let mut written = Vec::new();
        let mut i = 0;
        while started.elapsed() < for_ {
            let name = format!("w{i}");
            written.push((name.clone(), put_pod(&mut c, ns, &name, &[], "").await));
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        written
    })
}

const NS_READER: &str = r#"
authorization:
  rules:
    - {subjects: ["group:system:serviceaccounts:ns"], resources: [pods], namespaces: [ns], verbs: [list, watch]}
"#;

/// A JWT's `exp` ends its watch within 2 s with CREDENTIAL_EXPIRED; a fresh
/// JWT resumes from the version named, and the two watches together show
/// every write once. A JWT whose key leaves the JWKS file ends its watch
/// with CREDENTIAL_REVOKED within 5 s; one not valid yet is refused.
async fn jwt_expiry_and_revocation(path: ServePath) {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let k1 = issuer("k1");
    let jwks = write(dir.path(), "jwks.json", &k1.jwks);
    let file = write(
        dir.path(),
        "config.yaml",
        &config_text(
            &etcd,
            path,
            &(JWT_AUTH.replace("JWKS", &jwks.display().to_string()) + NS_READER),
        ),
    );
    let proxy = start_from(&file).await;
    let mut client = proxy.client().await;
    let fresh = k1.token("k1", now() + 600);
    let from = ready_version(&mut client, &fresh).await;

    // nbf in the future: refused.
    let early = k1.sign(
        "k1",
        serde_json::json!({
            "sub": "u", "groups": ["system:serviceaccounts:ns"],
            "iss": "https://kubernetes.default.svc", "aud": ["watchproxy"],
            "nbf": now() + 600, "exp": now() + 1200,
        }),
    );
    let err = list_as(&mut client, &early).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("nbf"), "{err:?}");

    // Expiry, with writes going on across it.
    let exp = now() + 3;
    let short = k1.token("k1", exp);
    let mut stream = watch_as(&mut client, &short, watch_from("ns", from)).await;
    let writer = write_for(&etcd, "ns", Duration::from_secs(5));
    let (status, at, mut seen) = read_until_end(&mut stream, Duration::from_secs(10)).await;
    let late = at.duration_since(UNIX_EPOCH + Duration::from_secs(exp));
    let late = late.expect("not before exp");
    eprintln!("{path:?}: the watch ended {late:?} after its JWT's exp");
    assert!(late <= Duration::from_secs(2), "ended {late:?} after exp");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, resume) = reason_and_resume(&status);
    assert_eq!(reason, "CREDENTIAL_EXPIRED");
    let resume = resume.expect("a resume version");
    // Refused on a new call as well.
    let err = list_as(&mut client, &short).await.unwrap_err();
    assert_eq!(reason_and_resume(&err).0, "CREDENTIAL_EXPIRED");

    let written = writer.await.unwrap();
    let mut resumed = watch_as(&mut client, &fresh, watch_from("ns", resume)).await;
    seen.extend(read_through(&mut resumed, written.last().unwrap().1).await);
    assert_eq!(seen, written, "no gap, no repeat across the end");

    // The key leaves the JWKS file: the watch ends within 5 s.
    let k2 = issuer("k2");
    let mut stream = watch_as(&mut client, &fresh, watch_from("ns", resume)).await;
    write(dir.path(), "jwks.json", &k2.jwks);
    let changed = SystemTime::now();
    let (status, at, _) = read_until_end(&mut stream, Duration::from_secs(10)).await;
    let after = at.duration_since(changed).unwrap();
    eprintln!("{path:?}: the watch ended {after:?} after its file changed");
    assert!(after <= Duration::from_secs(5), "{after:?}");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, resume) = reason_and_resume(&status);
    assert_eq!(reason, "CREDENTIAL_REVOKED");
    assert!(resume.is_some());
    // Every watch of a token the key signed ends: the resumed one too.
    let (status, _, _) = read_until_end(&mut resumed, Duration::from_secs(10)).await;
    assert_eq!(reason_and_resume(&status).0, "CREDENTIAL_REVOKED");
    let err = list_as(&mut client, &fresh).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(list_as(&mut client, &k2.token("k2", now() + 600))
        .await
        .is_ok());
    let ended = |reason: &str| {
        proxy.metric(
            "watchproxy_watchers_ended_total",
            &format!("resource=\"pods\",reason=\"{reason}\""),
        )
    };
    assert_eq!(ended("credential_expired"), 1.0);
    assert_eq!(ended("credential_revoked"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_that_expires_or_loses_its_key_ends_its_watch_on_the_fast_path() {
    jwt_expiry_and_revocation(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_that_expires_or_loses_its_key_ends_its_watch_on_the_tonic_path() {
    jwt_expiry_and_revocation(ServePath::Tonic).await;
}

const TOKEN_AUTH: &str = r#"
auth:
  tokens_file: TOKENS
  allow_plaintext_tokens: true
authorization:
  rules:
    - {subjects: ["user:alice"], resources: [pods], namespaces: ["*"], verbs: [list, watch]RULE}
    - {subjects: ["user:bob"], resources: [pods], namespaces: ["*"], verbs: [list, watch]}
"#;

/// The token-file configuration, alice's rule amended with `rule`.
fn token_config(etcd: &Etcd, path: ServePath, tokens: &Path, rule: &str) -> String {
    let auth = TOKEN_AUTH
        .replace("TOKENS", &tokens.display().to_string())
        .replace("RULE", rule);
    config_text(etcd, path, &auth)
}

/// alice and bob, each with a token of the token file and a watch of every
/// namespace, on a proxy started from its configuration file.
pub(crate) struct TwoUsers {
    pub(crate) etcd: Etcd,
    pub(crate) ec: etcd_client::Client,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) tokens: PathBuf,
    pub(crate) file: PathBuf,
    pub(crate) proxy: Proxy,
    pub(crate) client: WatchProxyClient<Channel>,
    pub(crate) alice: tonic::Streaming<WatchEvent>,
    pub(crate) bob: tonic::Streaming<WatchEvent>,
}

impl TwoUsers {
    pub(crate) async fn start(path: ServePath) -> TwoUsers {
        let etcd = Etcd::start().await;
        let ec = etcd.client().await;
        let dir = tempfile::tempdir().unwrap();
        let tokens = write(
            dir.path(),
            "tokens.yaml",
            "- {token: alice-1, user: alice}\n- {token: bob-1, user: bob}\n",
        );
        let text = token_config(&etcd, path, &tokens, "");
        let file = write(dir.path(), "config.yaml", &text);
        let proxy = start_from(&file).await;
        let mut client = proxy.client().await;
        let from = ready_version(&mut client, "alice-1").await;
        let alice = watch_as(&mut client, "alice-1", watch_from("", from)).await;
        let bob = watch_as(&mut client, "bob-1", watch_from("", from)).await;
        TwoUsers {
            etcd,
            ec,
            dir,
            tokens,
            file,
            proxy,
            client,
            alice,
            bob,
        }
    }
}

/// A watch `token`'s caller may open.
async fn watch_as(
    client: &mut WatchProxyClient<Channel>,
    token: &str,
    req: pb::WatchRequest,
) -> tonic::Streaming<WatchEvent> {
    let call = client.watch(as_caller(token, req)).await;
    call.expect("the watch is accepted").into_inner()
}

/// A token taken out of the token file ends its watches within 5 s with
/// CREDENTIAL_REVOKED; another user's go on; a new token resumes exactly.
async fn token_revocation(path: ServePath) {
    let TwoUsers {
        etcd: _etcd,
        mut ec,
        dir,
        proxy: _proxy,
        mut client,
        mut alice,
        mut bob,
        ..
    } = TwoUsers::start(path).await;
    let first = put_pod(&mut ec, "ns", "a", &[], "").await;
    assert_eq!(read_through(&mut alice, first).await.len(), 1);

    write(
        dir.path(),
        "tokens.yaml",
        "- {token: alice-2, user: alice}\n- {token: bob-1, user: bob}\n",
    );
    let changed = SystemTime::now();
    let (status, at, seen) = read_until_end(&mut alice, Duration::from_secs(10)).await;
    let after = at.duration_since(changed).unwrap();
    eprintln!("{path:?}: the watch ended {after:?} after its file changed");
    assert!(after <= Duration::from_secs(5), "{after:?}");
    assert!(seen.is_empty(), "{seen:?}");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, resume) = reason_and_resume(&status);
    assert_eq!(reason, "CREDENTIAL_REVOKED");
    assert_eq!(resume, Some(first));
    assert!(!status.message().contains("alice-1"), "{status:?}");
    let err = list_as(&mut client, "alice-1").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let second = put_pod(&mut ec, "ns", "b", &[], "").await;
    let mut resumed = watch_as(&mut client, "alice-2", watch_from("", first)).await;
    assert_eq!(
        read_through(&mut resumed, second).await,
        [("b".to_owned(), second)]
    );
    assert_eq!(
        read_through(&mut bob, second).await,
        [("a".to_owned(), first), ("b".to_owned(), second)],
        "another user's watch goes on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_taken_out_of_its_file_ends_its_watches_on_the_fast_path() {
    token_revocation(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_taken_out_of_its_file_ends_its_watches_on_the_tonic_path() {
    token_revocation(ServePath::Tonic).await;
}

/// A call identified from its headers whose body arrives after its token
/// left the token file is refused with CREDENTIAL_REVOKED, not served
/// under the identity its headers named: a `watchproxy.v1` Watch, an etcd
/// Watch stream (whose first request creates a watch) and an etcd Range.
async fn revoked_between_headers_and_body(path: ServePath) {
    use prost::Message;
    use watchproxy::etcdpb::etcdserverpb::{
        watch_request::RequestUnion, RangeRequest, WatchCreateRequest, WatchRequest,
    };
    let TwoUsers {
        etcd: _etcd,
        dir,
        proxy,
        mut client,
        ..
    } = TwoUsers::start(path).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let pods = (b"/registry/pods/".to_vec(), b"/registry/pods0".to_vec());
    let etcd_watch = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: pods.0.clone().into(),
            range_end: pods.1.clone().into(),
            ..Default::default()
        })),
    };
    let etcd_range = RangeRequest {
        key: pods.0.into(),
        range_end: pods.1.into(),
        ..Default::default()
    };
    let calls = [
        (
            "/watchproxy.v1.WatchProxy/Watch",
            watch_from("", 0).encode_to_vec(),
        ),
        ("/etcdserverpb.Watch/Watch", etcd_watch.encode_to_vec()),
        ("/etcdserverpb.KV/Range", etcd_range.encode_to_vec()),
    ];
    let mut open = Vec::new();
    for (method, message) in calls {
        let mut send = send.clone().ready().await.unwrap();
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://localhost{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", "Bearer alice-1")
            .body(())
            .unwrap();
        let (response, body) = send.send_request(request, false).unwrap();
        open.push((method, message, response, body));
    }

    // alice's token leaves the file; once it is read again, a new call
    // with it is refused.
    write(dir.path(), "tokens.yaml", "- {token: bob-1, user: bob}\n");
    let mut read_again = false;
    for _ in 0..100 {
        if let Err(e) = list_as(&mut client, "alice-1").await {
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            read_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(read_again, "the token file is read again within 10 s");

    for (method, message, response, mut body) in open {
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        // A stream's end would tell the server no more is coming; the
        // etcd Watch stream is left open, as its clients leave it.
        let _ = body.send_data(framed.into(), !method.ends_with("Watch/Watch"));
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("an answer within 10 s")
            .unwrap();
        let status = match response.headers().get("grpc-status") {
            Some(status) => status.clone(),
            None => {
                let mut stream = response.into_body();
                let trailers = tokio::time::timeout(Duration::from_secs(3), async {
                    while stream.data().await.is_some() {}
                    stream.trailers().await
                })
                .await
                .unwrap_or_else(|_| panic!("{method} was served under the revoked token"));
                trailers.unwrap().unwrap()["grpc-status"].clone()
            }
        };
        assert_eq!(status, "16", "{path:?} {method}: UNAUTHENTICATED");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_between_a_calls_headers_and_body_refuses_it_on_the_fast_path() {
    revoked_between_headers_and_body(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_between_a_calls_headers_and_body_refuses_it_on_the_tonic_path() {
    revoked_between_headers_and_body(ServePath::Tonic).await;
}

/// The configuration file read again: a narrowed rule ends the watches it
/// no longer allows with ACCESS_CHANGED (a new watch then sees only what
/// the rule allows) and leaves the others; a file that does not validate
/// is refused whole; a change outside `auth` and the rules is counted as
/// needing a restart; SIGHUP reads the file.
async fn config_reload(path: ServePath) {
    let TwoUsers {
        etcd,
        mut ec,
        dir,
        tokens,
        file,
        proxy,
        mut client,
        mut alice,
        mut bob,
    } = TwoUsers::start(path).await;
    let web = put_pod(&mut ec, "ns", "web", &[("app", "web")], "").await;
    assert_eq!(read_through(&mut alice, web).await.len(), 1);

    // alice now sees only app=web.
    write(
        dir.path(),
        "config.yaml",
        &token_config(&etcd, path, &tokens, r#", label_selector: "app=web""#),
    );
    let changed = SystemTime::now();
    let (status, at, _) = read_until_end(&mut alice, Duration::from_secs(10)).await;
    let after = at.duration_since(changed).unwrap();
    eprintln!("{path:?}: the watch ended {after:?} after its file changed");
    assert!(after <= Duration::from_secs(5), "{after:?}");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let (reason, resume) = reason_and_resume(&status);
    assert_eq!((reason.as_str(), resume), ("ACCESS_CHANGED", Some(web)));
    let reloads = |result: &str| {
        proxy.metric(
            "watchproxy_config_reloads_total",
            &format!("result=\"{result}\""),
        )
    };
    assert_eq!(reloads("applied"), 1.0);

    let mut narrowed = watch_as(&mut client, "alice-1", watch_from("", web)).await;
    put_pod(&mut ec, "ns", "db", &[("app", "db")], "").await;
    let web2 = put_pod(&mut ec, "ns", "web2", &[("app", "web")], "").await;
    assert_eq!(
        read_through(&mut narrowed, web2).await,
        [("web2".to_owned(), web2)],
        "only what the new rule allows"
    );
    assert_eq!(
        read_through(&mut bob, web2).await.len(),
        3,
        "bob's rule did not change: his watch goes on"
    );

    // A file that does not validate: refused whole, the rules in use stay.
    let good = std::fs::read_to_string(&file).unwrap();
    write(
        dir.path(),
        "config.yaml",
        &format!("{good}\nunknown_key: 1\n"),
    );
    // At least once: the other serve path's test, in this process, sends
    // SIGHUP, which reads this file again too.
    wait_until("the invalid file is counted", || reloads("invalid") >= 1.0).await;
    let err = list_as(&mut client, "nobody").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(list_as(&mut client, "alice-1").await.is_ok());

    // A section that applies only at start.
    write(
        dir.path(),
        "config.yaml",
        &good.replace("shutdown_grace: 5s", "shutdown_grace: 6s"),
    );
    wait_until("the restart is counted", || {
        reloads("restart_needed") >= 1.0
    })
    .await;
    assert_eq!(reloads("applied"), 1.0);

    // SIGHUP reads the file, changed or not.
    let unchanged = reloads("unchanged");
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_until("SIGHUP reads the file", || {
        reloads("restart_needed") + reloads("unchanged") > 1.0 + unchanged
    })
    .await;
    // The open watches were judged again and go on.
    let last = put_pod(&mut ec, "ns", "web3", &[("app", "web")], "").await;
    assert_eq!(read_through(&mut narrowed, last).await.len(), 1);
    assert_eq!(read_through(&mut bob, last).await.len(), 1);
    assert_eq!(
        proxy.metric(
            "watchproxy_watchers_ended_total",
            "resource=\"pods\",reason=\"access_changed\""
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_read_again_ends_only_the_watches_it_no_longer_allows_on_the_fast_path() {
    config_reload(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_read_again_ends_only_the_watches_it_no_longer_allows_on_the_tonic_path()
{
    config_reload(ServePath::Tonic).await;
}

pub(crate) async fn tls_client(
    proxy: &Proxy,
    ca: &str,
    identity: &(String, String),
) -> WatchProxyClient<Channel> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
        .identity(Identity::from_pem(&identity.0, &identity.1));
    let channel = Channel::from_shared(format!("https://{}", proxy.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    WatchProxyClient::new(channel)
}

/// A client certificate's notAfter ends its watches within 2 s with
/// CREDENTIAL_EXPIRED, and the calls its connection makes after are
/// refused the same way; a new certificate resumes with no gap.
async fn certificate_expiry(path: ServePath) {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (test_ca("server-ca"), test_ca("client-ca"));
    let tls = mutual_tls(dir.path(), &server_ca, &client_ca.pem(), "ca.crt");
    let file = write(dir.path(), "config.yaml", &config_text(&etcd, path, &tls));
    let proxy = start_from(&file).await;
    let not_after = now() + 4;
    let short = leaf_until(&client_ca, "agent", not_after);
    let mut client = tls_client(&proxy, &server_ca.pem(), &short).await;
    wait_ready(&mut client, "pods").await;
    let from = list_version(&mut client, "pods", "").await;
    let mut stream = open_watch(&mut client, watch_from("", from)).await;
    let writer = write_for(&etcd, "ns", Duration::from_secs(6));
    let (status, at, mut seen) = read_until_end(&mut stream, Duration::from_secs(15)).await;
    let late = (at.duration_since(UNIX_EPOCH + Duration::from_secs(not_after)))
        .expect("not before notAfter");
    eprintln!("{path:?}: the watch ended {late:?} after its certificate's notAfter");
    assert!(
        late <= Duration::from_secs(2),
        "ended {late:?} after notAfter"
    );
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, resume) = reason_and_resume(&status);
    assert_eq!(reason, "CREDENTIAL_EXPIRED");
    let resume = resume.expect("a resume version");
    // The connection stays; what it asks for now is refused.
    let err = (client.list(pb::ListRequest {
        resource: "pods".into(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(reason_and_resume(&err).0, "CREDENTIAL_EXPIRED", "{err:?}");

    let written = writer.await.unwrap();
    let fresh = leaf_until(&client_ca, "agent", now() + 600);
    let mut client = tls_client(&proxy, &server_ca.pem(), &fresh).await;
    let mut resumed = open_watch(&mut client, watch_from("", resume)).await;
    seen.extend(read_through(&mut resumed, written.last().unwrap().1).await);
    assert_eq!(seen, written, "no gap, no repeat across the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_that_expires_ends_its_watches_on_the_fast_path() {
    certificate_expiry(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_that_expires_ends_its_watches_on_the_tonic_path() {
    certificate_expiry(ServePath::Tonic).await;
}

/// A per-user watch limit lowered in the configuration file ends the
/// newest watches beyond it with ACCESS_CHANGED; the oldest and other
/// users' go on.
async fn lowered_watch_limit(path: ServePath) {
    let TwoUsers {
        etcd,
        mut ec,
        dir,
        tokens,
        proxy: _proxy,
        mut client,
        mut alice,
        mut bob,
        ..
    } = TwoUsers::start(path).await;
    let from = put_pod(&mut ec, "ns", "a", &[], "").await;
    let mut newer = Vec::new();
    for _ in 0..2 {
        newer.push(watch_as(&mut client, "alice-1", watch_from("", from)).await);
    }
    let text = token_config(&etcd, path, &tokens, "").replace(
        "  max_concurrent_unary: 4096",
        "  max_concurrent_unary: 4096\n  max_watchers_per_user: 1",
    );
    write(dir.path(), "config.yaml", &text);
    for stream in &mut newer {
        let (status, _, _) = read_until_end(stream, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        let (reason, resume) = reason_and_resume(&status);
        assert_eq!((reason.as_str(), resume), ("ACCESS_CHANGED", Some(from)));
    }
    let next = put_pod(&mut ec, "ns", "b", &[], "").await;
    assert_eq!(
        read_through(&mut alice, next).await.len(),
        2,
        "the oldest goes on"
    );
    assert_eq!(read_through(&mut bob, next).await.len(), 2);
    let err = client
        .watch(as_caller("alice-1", watch_from("", next)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_watch_limit_ends_the_newest_watches_beyond_it_on_the_fast_path() {
    lowered_watch_limit(ServePath::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_watch_limit_ends_the_newest_watches_beyond_it_on_the_tonic_path() {
    lowered_watch_limit(ServePath::Tonic).await;
}
