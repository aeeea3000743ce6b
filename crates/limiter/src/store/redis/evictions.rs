//! Evictions Redis reports (INFO's `evicted_keys`, on every primary): a rise is warned once per episode, counted in
//! `tollgate_store_evicted_keys_total`, and named in `/readyz` while the episode lasts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{CustomCommand, InfoKind};
use parking_lot::Mutex;

use super::RedisTopology;

/// An episode of evictions ends after this long without one: its warning leaves `/readyz`, and the next rise is
/// warned again. Long enough that a Redis evicting every few seconds under a steady flood is one episode.
const EPISODE_QUIET: Duration = Duration::from_secs(60);

/// How long the reading at connect waits for Redis.
const CONNECT_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// What the store has seen of Redis's evictions.
#[derive(Debug)]
pub(super) struct Evictions {
    seen: Mutex<Seen>,
    /// `tollgate_store_evicted_keys_total`: keys Redis evicted while this instance watched.
    counted: metrics::Counter,
}

#[derive(Debug, Default)]
struct Seen {
    /// `evicted_keys` as each node last said it (the node's address; one entry but on Cluster).
    last: HashMap<String, u64>,
    /// The episode under way: when its last rise was seen, and what it evicted so far.
    episode: Option<Episode>,
}

#[derive(Debug, Clone, Copy)]
struct Episode {
    started: Instant,
    last_rise: Instant,
    evicted: u64,
}

// === impl Evictions ===

impl Default for Evictions {
    fn default() -> Self {
        Self {
            seen: Mutex::default(),
            counted: metrics::counter!("tollgate_store_evicted_keys_total"),
        }
    }
}

impl Evictions {
    /// Reads where Redis stands each time the first of `clients` connects: evictions made before (or while this
    /// instance was away) are not this instance's news, and those made from then on are counted from the first
    /// health check.
    pub(super) fn read_on_connect(self: &Arc<Self>, clients: &[Client], topology: RedisTopology) {
        let Some(first) = clients.first() else {
            return;
        };
        let (evictions, client) = (Arc::downgrade(self), first.clone());
        let _reads = first.on_reconnect(move |_| {
            let (evictions, client) = (evictions.clone(), client.clone());
            async move {
                if let Some(evictions) = evictions.upgrade() {
                    evictions
                        .read(&client, topology, CONNECT_READ_TIMEOUT)
                        .await;
                }
                Ok(())
            }
        });
    }

    /// Reads `evicted_keys` from every primary (`client`'s server, or each primary of a Cluster) and takes in what
    /// rose since the last reading. A node that does not answer in `timeout` is read again next time; the first
    /// reading of a node only sets where it stands (what it evicted before counts for nothing here).
    pub(super) async fn read(&self, client: &Client, topology: RedisTopology, timeout: Duration) {
        let readings = match topology {
            RedisTopology::Cluster => read_primaries(client, timeout).await,
            RedisTopology::Standalone | RedisTopology::Sentinel => {
                let options = Options {
                    timeout: Some(timeout),
                    fail_fast: true,
                    ..Default::default()
                };
                let info: Result<String, _> = client
                    .with_options(&options)
                    .info(Some(InfoKind::Stats))
                    .await;
                if let Err(error) = &info {
                    tracing::debug!(%error, "cannot read redis's evicted_keys");
                }
                // One node: however it was reached (a failover keeps the name, not the server).
                info.ok()
                    .and_then(|info| evicted_keys(&info))
                    .map(|evicted| vec![(String::new(), evicted)])
                    .unwrap_or_default()
            }
        };
        self.took_in(readings, Instant::now());
    }

    /// What `/readyz` says while an episode lasts.
    pub(super) fn warning(&self) -> Option<String> {
        let seen = self.seen.lock();
        let episode = seen.episode?;
        (episode.last_rise.elapsed() < EPISODE_QUIET).then(|| {
            format!(
                "redis evicted {} keys in the last {}s (maxmemory reached): evicted limit state starts afresh and \
                 over-admits; raise maxmemory or use maxmemory-policy noeviction",
                episode.evicted,
                episode.started.elapsed().as_secs().max(1)
            )
        })
    }

    /// Takes in one reading per node at `now`: counts the rises, and warns at an episode's first.
    fn took_in(&self, readings: Vec<(String, u64)>, now: Instant) {
        let mut seen = self.seen.lock();
        let mut rose = 0;
        for (node, evicted) in readings {
            // A fall is a restarted Redis or `CONFIG RESETSTAT`: it starts from there.
            if let Some(before) = seen.last.insert(node, evicted) {
                rose += evicted.saturating_sub(before);
            }
        }
        if rose == 0 {
            return;
        }
        self.counted.increment(rose);
        let ongoing = seen
            .episode
            .filter(|episode| now.saturating_duration_since(episode.last_rise) < EPISODE_QUIET);
        match ongoing {
            Some(episode) => {
                seen.episode = Some(Episode {
                    last_rise: now,
                    evicted: episode.evicted + rose,
                    ..episode
                });
            }
            None => {
                tracing::warn!(
                    evicted = rose,
                    "redis is evicting keys (maxmemory reached): evicted limit state starts afresh and over-admits; \
                     raise maxmemory or use maxmemory-policy noeviction"
                );
                seen.episode = Some(Episode {
                    started: now,
                    last_rise: now,
                    evicted: rose,
                });
            }
        }
    }
}

/// `evicted_keys` from each primary of a Cluster, by address: the primaries as `CLUSTER NODES` lists them, each
/// asked for its INFO. Nodes that do not answer are left out.
async fn read_primaries(client: &Client, timeout: Duration) -> Vec<(String, u64)> {
    let options = Options {
        timeout: Some(timeout),
        fail_fast: true,
        ..Default::default()
    };
    let command = CustomCommand::new_static("CLUSTER", None, false);
    let nodes: Result<String, _> = client
        .with_options(&options)
        .custom(command, vec![Value::from("NODES")])
        .await;
    let nodes = match nodes {
        Ok(nodes) => nodes,
        Err(error) => {
            tracing::debug!(%error, "cannot list the cluster's primaries");
            return Vec::new();
        }
    };
    let mut readings = Vec::new();
    for address in primaries(&nodes) {
        let Some((host, port)) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        else {
            continue;
        };
        let on_node = Options {
            cluster_node: Some(Server::new(host, port)),
            ..options.clone()
        };
        let info: Result<String, _> = client
            .with_options(&on_node)
            .info(Some(InfoKind::Stats))
            .await;
        match info.map(|info| evicted_keys(&info)) {
            Ok(Some(evicted)) => readings.push((address.to_owned(), evicted)),
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, address, "cannot read evicted_keys"),
        }
    }
    readings
}

/// The addresses (`host:port`) of the primaries `CLUSTER NODES` lists, failed ones left out.
fn primaries(nodes: &str) -> impl Iterator<Item = &str> {
    nodes.lines().filter_map(|line| {
        let mut fields = line.split(' ');
        let address = fields.nth(1)?;
        let flags = fields.next()?;
        let primary = flags.split(',').any(|flag| flag == "master")
            && !flags
                .split(',')
                .any(|flag| flag == "fail" || flag == "fail?");
        // `host:port@cport[,hostname]`
        primary.then(|| address.split('@').next().unwrap_or(address))
    })
}

/// The `evicted_keys` field of an INFO answer.
fn evicted_keys(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("evicted_keys:"))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_is_counted_and_warned_once_per_episode() {
        let evictions = Evictions::default();
        let start = Instant::now();
        // The first reading sets where the node stands.
        evictions.took_in(vec![(String::new(), 500)], start);
        assert!(evictions.seen.lock().episode.is_none());
        evictions.took_in(vec![(String::new(), 530)], start + Duration::from_secs(1));
        evictions.took_in(vec![(String::new(), 540)], start + Duration::from_secs(2));
        assert_eq!(evictions.seen.lock().episode.map(|e| e.evicted), Some(40));
        // A restarted Redis counts from zero again, and its rises add up.
        evictions.took_in(vec![(String::new(), 3)], start + Duration::from_secs(3));
        evictions.took_in(vec![(String::new(), 5)], start + Duration::from_secs(4));
        assert_eq!(evictions.seen.lock().episode.map(|e| e.evicted), Some(42));
        // Quiet for an episode's length: the next rise starts another.
        evictions.took_in(vec![(String::new(), 6)], start + Duration::from_secs(70));
        assert_eq!(evictions.seen.lock().episode.map(|e| e.evicted), Some(1));
    }

    #[test]
    fn info_and_cluster_nodes_are_read() {
        let info = "# Stats\r\ntotal_connections_received:3\r\nevicted_keys:104975\r\nevicted_clients:0\r\n";
        assert_eq!(evicted_keys(info), Some(104_975));
        assert_eq!(evicted_keys("# Stats\r\n"), None);
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n\
                     c3 127.0.0.1:7003@17003 slave a1 0 0 1 connected\n\
                     d4 127.0.0.1:7002@17002 master,fail - 0 0 3 connected\n";
        assert_eq!(
            primaries(nodes).collect::<Vec<_>>(),
            ["127.0.0.1:7000", "127.0.0.1:7001"]
        );
    }
}
