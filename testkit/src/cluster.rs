//! A real 3-member (or n-member) etcd cluster on loopback, for leader
//! changes and the loss of a member; killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use etcd_client::Client;

use super::{etcd_binary, free_port, ETCD_INSTALL_HINT};

pub struct Member {
    pub name: String,
    pub client_url: String,
    peer_url: String,
    data: PathBuf,
    child: Option<Child>,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    initial_cluster: String,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until they have a leader.
    pub async fn start(n: usize) -> EtcdCluster {
        Self::try_start(n).await.unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A start on loopback ports found free can lose one to another test
    /// between the look and etcd's bind: a cluster that elects no leader
    /// is started again on other ports, twice at most.
    async fn try_start(n: usize) -> anyhow::Result<EtcdCluster> {
        let mut failed = Vec::new();
        for _ in 0..3 {
            match Self::start_once(n).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        bail!("{}", failed.join("\n--- started again ---\n"))
    }

    async fn start_once(n: usize) -> anyhow::Result<EtcdCluster> {
        let binary = etcd_binary().context(ETCD_INSTALL_HINT)?;
        let dir = tempfile::tempdir()?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{}", free_port()),
                peer_url: format!("http://127.0.0.1:{}", free_port()),
                data: dir.path().join(format!("m{i}")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            binary,
            dir,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        if let Err(e) = cluster.wait_leader().await {
            return Err(e.context(cluster.members_state()));
        }
        cluster.wait_serving().await?;
        Ok(cluster)
    }

    /// Waits until every member answers on its client URL: a leader needs
    /// only a majority, and a client of every member that reaches one still
    /// starting is refused.
    async fn wait_serving(&self) -> anyhow::Result<()> {
        for m in &self.members {
            let mut serving = false;
            for _ in 0..200 {
                if let Ok(mut c) = Client::connect([&m.client_url], None).await {
                    if c.status().await.is_ok() {
                        serving = true;
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !serving {
                bail!("etcd member {} does not answer on {}", m.name, m.client_url);
            }
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.path().join(format!("m{i}.log")))?;
        let m = &self.members[i];
        let child = Command::new(&self.binary)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args(["--listen-client-urls", &m.client_url])
            .args(["--advertise-client-urls", &m.client_url])
            .args(["--listen-peer-urls", &m.peer_url])
            .args(["--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", "watchproxy-tests"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--experimental-watch-progress-notify-interval", "1s"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}. {ETCD_INSTALL_HINT}", self.binary.display()))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// A client of every member.
    pub async fn client(&self) -> Client {
        Client::connect(self.client_urls(), None).await.unwrap()
    }

    /// The index of the leader, as the running members see it.
    pub async fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok(mut c) = Client::connect([&m.client_url], None).await else {
                continue;
            };
            let Ok(status) = c.status().await else {
                continue;
            };
            let leader = status.leader();
            for (i, other) in self.members.iter().enumerate() {
                let Ok(mut oc) = Client::connect([&other.client_url], None).await else {
                    continue;
                };
                if let Ok(s) = oc.status().await {
                    if s.header().is_some_and(|h| h.member_id() == leader) {
                        return Some(i);
                    }
                }
            }
        }
        None
    }

    /// Which members have exited, and the end of each one's log.
    fn members_state(&mut self) -> String {
        let dir = self.dir.path().to_owned();
        let mut state = Vec::new();
        for (i, m) in self.members.iter_mut().enumerate() {
            let exited = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            let log = std::fs::read_to_string(dir.join(format!("m{i}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            state.push(format!(
                "{} ({}): {}",
                m.name,
                exited.map_or("running".to_owned(), |s| format!("exited, {s}")),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        state.join("; ")
    }

    async fn wait_leader(&self) -> anyhow::Result<usize> {
        for _ in 0..200 {
            if let Some(i) = self.leader().await {
                return Ok(i);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the etcd cluster elected no leader")
    }

    /// Hands leadership from the leader to another member.
    pub async fn move_leader(&self) -> usize {
        let from = self.wait_leader().await.unwrap();
        let to = (from + 1) % self.members.len();
        let id = |i: usize| {
            let url = self.members[i].client_url.clone();
            async move {
                let mut c = Client::connect([url], None).await.unwrap();
                c.status().await.unwrap().header().unwrap().member_id()
            }
        };
        let target = id(to).await;
        let mut leader = Client::connect([&self.members[from].client_url], None)
            .await
            .unwrap();
        leader.move_leader(target).await.unwrap();
        for _ in 0..100 {
            if self.leader().await == Some(to) {
                return to;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("leadership did not move to member {to}");
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data, and waits for a leader.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i).unwrap();
        self.wait_leader().await.unwrap();
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
