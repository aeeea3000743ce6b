//! The runtime consumer directory shared through Redis: a change made through one instance reaches another within
//! a second, by announcement or, when the announcement is missed, by the change counter's checks; Redis started
//! late, restarted empty or on a Cluster still leaves every instance with what Redis holds.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cluster::RedisCluster;
use common::eventually;
use common::redis::RedisServer;
use tollgate::consumers::api_key_digest as digest;
use tollgate::consumers::directory::{ConsumerRecord, Directory, DirectoryError, Known};

/// How long a change may take to reach another instance (docs/operations.md, "Consumers at runtime").
const ONE_SECOND: Duration = Duration::from_secs(1);

/// A directory on the Redis at `url` under the default key prefix (`tollgate:`).
fn directory(url: &str) -> Arc<Directory> {
    let config = common::config(&format!(
        "store: {{ backend: redis, url: \"{url}\" }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200 }} }}\n"
    ));
    Directory::from_settings(&config.store).expect("directory")
}

/// Waits until `directory` has read Redis once.
async fn synced(directory: &Directory) {
    assert!(
        eventually(Duration::from_secs(10), async || directory.synced())
            .await
            .is_some(),
        "the directory never read redis"
    );
}

fn plan(name: &str) -> ConsumerRecord {
    ConsumerRecord {
        plan: Some(name.to_owned()),
        ..ConsumerRecord::default()
    }
}

fn plan_of(directory: &Directory, id: &str) -> Option<String> {
    directory
        .consumer(id)
        .and_then(|record| record.plan.clone())
}

#[tokio::test]
async fn a_change_through_one_instance_reaches_the_other_within_a_second() {
    let redis = RedisServer::start();
    let (one, other) = (directory(&redis.url()), directory(&redis.url()));
    synced(&one).await;
    synced(&other).await;

    assert_eq!(one.put("acme", plan("pro")).await.expect("put"), None);
    // The instance that made the change has it at once.
    assert_eq!(plan_of(&one, "acme").as_deref(), Some("pro"));
    let took = eventually(ONE_SECOND, async || {
        plan_of(&other, "acme").as_deref() == Some("pro")
    })
    .await;
    assert!(
        took.is_some(),
        "the change did not reach the other instance"
    );

    // And back: the record before is what the first wrote.
    let mut blocked = plan("free");
    blocked.blocked = true;
    let before = other.put("acme", blocked).await.expect("put");
    assert_eq!(before.and_then(|b| b.plan).as_deref(), Some("pro"));
    let took = eventually(ONE_SECOND, async || {
        one.consumer("acme").is_some_and(|record| record.blocked)
    })
    .await;
    assert!(took.is_some(), "blocked did not reach the first instance");

    assert!(other.delete("acme").await.expect("delete").is_some());
    assert!(
        eventually(ONE_SECOND, async || one.consumer("acme").is_none())
            .await
            .is_some()
    );
    // Stored as the JSON the docs show, in one hash under one hash tag.
    assert_eq!(
        redis.cli(&["HLEN", "tollgate:{consumers}"]).as_deref(),
        Some("0")
    );
    assert_eq!(
        redis
            .cli(&["GET", "tollgate:{consumers}:version"])
            .as_deref(),
        Some("3")
    );
}

#[tokio::test]
async fn a_key_issued_on_one_instance_identifies_on_the_other_until_revoked() {
    let redis = RedisServer::start();
    let (one, other) = (directory(&redis.url()), directory(&redis.url()));
    synced(&one).await;
    synced(&other).await;

    let (key, text) = one.add_key("acme").await.expect("key");
    let digest = digest(&text);
    assert!(eventually(ONE_SECOND, async || {
        other.consumer_of_key(&digest).as_deref() == Some("acme")
    })
    .await
    .is_some());
    // Only the digest is stored.
    let stored = redis
        .cli(&["HGET", "tollgate:{consumers}", "acme"])
        .expect("record");
    assert!(stored.contains(&key.sha256), "{stored}");
    assert!(!stored.contains(&text), "{stored}");
    // A put keeps the keys.
    other.put("acme", plan("pro")).await.expect("put");
    assert_eq!(one.consumer_of_key(&digest).as_deref(), Some("acme"));

    assert!(one.revoke_key("acme", &key.id).await.expect("revoke"));
    let took = eventually(ONE_SECOND, async || {
        other.consumer_of_key(&digest).is_none()
    })
    .await;
    assert!(
        took.is_some(),
        "the revoked key still identifies on the other instance"
    );
    assert_eq!(plan_of(&other, "acme").as_deref(), Some("pro"));
}

#[tokio::test]
async fn a_change_whose_announcement_was_missed_arrives_by_the_counter_check() {
    let redis = RedisServer::start();
    let one = directory(&redis.url());
    synced(&one).await;

    // Written as another instance would, but never announced.
    let json = r#"{"plan":"enterprise","blocked":true}"#;
    assert_eq!(
        redis
            .cli(&["HSET", "tollgate:{consumers}", "initech", json])
            .as_deref(),
        Some("1")
    );
    redis.cli(&["INCR", "tollgate:{consumers}:version"]);
    let took = eventually(ONE_SECOND, async || {
        plan_of(&one, "initech").as_deref() == Some("enterprise")
    })
    .await;
    assert!(took.is_some(), "the unannounced change was never read");
    assert!(one.consumer("initech").is_some_and(|r| r.blocked));

    // A record that is not one is left out, and the others still read.
    redis.cli(&["HSET", "tollgate:{consumers}", "broken", "{not json"]);
    redis.cli(&[
        "HSET",
        "tollgate:{consumers}",
        "globex",
        r#"{"plan":"free"}"#,
    ]);
    redis.cli(&["INCR", "tollgate:{consumers}:version"]);
    assert!(eventually(ONE_SECOND, async || {
        plan_of(&one, "globex").as_deref() == Some("free")
    })
    .await
    .is_some());
    assert!(one.consumer("broken").is_none());
    // Changing it fails with a reason; deleting it works.
    assert!(matches!(
        one.put("broken", plan("pro")).await,
        Err(DirectoryError::Unreadable { .. })
    ));
    assert_eq!(one.delete("broken").await.expect("delete"), None);
    assert_eq!(
        redis
            .cli(&["HEXISTS", "tollgate:{consumers}", "broken"])
            .as_deref(),
        Some("0")
    );
}

#[tokio::test]
async fn a_directory_started_before_redis_reads_it_once_it_answers() {
    // Held, not listening: connections are refused until Redis is handed the port.
    let port = common::ReservedPort::new();
    let one = directory(&format!("redis://{}", port.addr()));
    // No Redis: changes fail, and say why.
    match one.put("acme", plan("pro")).await {
        Err(DirectoryError::Unavailable(reason)) => assert!(!reason.is_empty()),
        other => panic!("a change without redis: {other:?}"),
    }
    assert!(!one.synced());

    let redis = RedisServer::start_on(port);
    redis.cli(&["HSET", "tollgate:{consumers}", "acme", r#"{"plan":"pro"}"#]);
    redis.cli(&["INCR", "tollgate:{consumers}:version"]);
    assert!(
        eventually(Duration::from_secs(2), async || {
            plan_of(&one, "acme").as_deref() == Some("pro")
        })
        .await
        .is_some(),
        "the directory did not read redis once it answered"
    );
    assert!(one.put("globex", plan("free")).await.is_ok());
}

#[tokio::test]
async fn reads_outlive_redis_and_a_redis_restarted_empty_empties_every_instance() {
    let mut redis = RedisServer::start();
    let (one, other) = (directory(&redis.url()), directory(&redis.url()));
    synced(&one).await;
    synced(&other).await;
    let (_, text) = one.add_key("acme").await.expect("key");
    one.put("acme", plan("pro")).await.expect("put");
    assert!(
        eventually(ONE_SECOND, async || plan_of(&other, "acme").is_some())
            .await
            .is_some()
    );

    redis.kill();
    // Redis is gone: what was read keeps serving, changes fail.
    assert!(matches!(
        one.put("acme", plan("free")).await,
        Err(DirectoryError::Unavailable(_))
    ));
    assert_eq!(plan_of(&one, "acme").as_deref(), Some("pro"));
    assert_eq!(
        other.consumer_of_key(&digest(&text)).as_deref(),
        Some("acme")
    );

    // Back, empty (no persistence): every instance holds what Redis holds, nothing.
    redis.restart();
    for directory in [&one, &other] {
        let took = eventually(Duration::from_secs(2), async || {
            directory.is_empty() && directory.consumer_of_key(&digest(&text)).is_none()
        })
        .await;
        assert!(
            took.is_some(),
            "an instance kept records redis no longer has"
        );
    }
    one.put("globex", plan("free"))
        .await
        .expect("put after restart");
    assert!(
        eventually(ONE_SECOND, async || plan_of(&other, "globex").is_some())
            .await
            .is_some()
    );
}

#[tokio::test]
async fn on_a_cluster_changes_and_keys_reach_the_other_instance() {
    let cluster = RedisCluster::start();
    let (one, other) = (directory(&cluster.url()), directory(&cluster.url()));
    synced(&one).await;
    synced(&other).await;
    // Ids hashing to different slots live in one hash: no command crosses slots.
    for id in ["acme", "globex", "initech"] {
        one.put(id, plan("pro")).await.expect("put");
    }
    let (_, text) = other.add_key("globex").await.expect("key");
    let took = eventually(ONE_SECOND, async || {
        ["acme", "globex", "initech"]
            .iter()
            .all(|id| plan_of(&other, id).is_some())
            && one.consumer_of_key(&digest(&text)).as_deref() == Some("globex")
    })
    .await;
    assert!(
        took.is_some(),
        "changes did not cross instances on the cluster"
    );
}

/// What a flush followed by `changes.len()` changes leaves, as one step (so that no check can fall between): the
/// records `changes` (id, JSON), a counter at their number, and the new counter's lineage, as a writer sets it.
fn flush_and_change(redis: &RedisServer, changes: &[(&str, &str)]) {
    let script = String::from(
        "redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) \
         for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end \
         redis.call('SET', KEYS[2], #ARGV / 2) redis.call('SET', KEYS[3], 'f1u5h') return 1",
    );
    let mut args = vec![
        "EVAL",
        &script,
        "3",
        "tollgate:{consumers}",
        "tollgate:{consumers}:version",
        "tollgate:{consumers}:lineage",
    ];
    for (id, json) in changes {
        args.push(id);
        args.push(json);
    }
    assert_eq!(redis.cli(&args).as_deref(), Some("1"));
}

#[tokio::test]
async fn a_flush_followed_by_as_many_changes_does_not_fool_the_change_counter() {
    let redis = RedisServer::start();
    let (one, other) = (directory(&redis.url()), directory(&redis.url()));
    synced(&one).await;
    synced(&other).await;
    let (_, text) = one.add_key("acme").await.expect("key");
    one.put("globex", plan("pro")).await.expect("put");
    one.put("initech", plan("pro")).await.expect("put");
    for directory in [&one, &other] {
        let took = eventually(ONE_SECOND, async || directory.len() == 3).await;
        assert!(took.is_some(), "three records everywhere");
    }

    // Flushed, then three changes: the counter is at 3 again, in another lineage.
    flush_and_change(
        &redis,
        &[
            ("hooli", r#"{"plan":"free"}"#),
            ("umbrella", r#"{"plan":"free"}"#),
            ("wonka", r#"{"plan":"free"}"#),
        ],
    );
    for (name, directory) in [("one", &one), ("other", &other)] {
        let took = eventually(ONE_SECOND, async || {
            plan_of(directory, "hooli").is_some()
                && directory.len() == 3
                && directory.consumer_of_key(&digest(&text)).is_none()
        })
        .await;
        assert!(
            took.is_some(),
            "{name} kept the flushed records and missed the new ones"
        );
        assert_eq!(directory.resets(), 1, "{name}");
    }

    // The same through the directory's own writes, flushed by hand in between: every instance follows.
    redis.cli(&["FLUSHALL"]);
    for id in ["alpha", "beta", "gamma"] {
        one.put(id, plan("pro")).await.expect("put");
    }
    for (name, directory) in [("one", &one), ("other", &other)] {
        let took = eventually(ONE_SECOND, async || {
            ["alpha", "beta", "gamma"]
                .iter()
                .all(|id| plan_of(directory, id).is_some())
                && directory.len() == 3
        })
        .await;
        assert!(
            took.is_some(),
            "{name} did not follow the flush and the new records"
        );
        assert_eq!(directory.resets(), 2, "{name}");
    }
}

#[tokio::test]
async fn a_directory_that_lost_its_data_is_noticed_at_once_and_counted_once() {
    let redis = RedisServer::start();
    let (one, other) = (directory(&redis.url()), directory(&redis.url()));
    synced(&one).await;
    synced(&other).await;
    one.put("acme", plan("pro")).await.expect("put");
    assert!(
        eventually(ONE_SECOND, async || plan_of(&other, "acme").is_some())
            .await
            .is_some()
    );
    assert_eq!((one.resets(), other.resets()), (0, 0));

    redis.cli(&["FLUSHALL"]);
    for (name, directory) in [("one", &one), ("other", &other)] {
        // Within one counter check (250 ms), with room for a loaded machine.
        let took = eventually(ONE_SECOND, async || {
            directory.is_empty() && directory.resets() == 1
        })
        .await;
        assert!(took.is_some(), "{name} never noticed the flush");
    }
    // Counted once, not at every check that finds the directory empty.
    for _ in 0..4 {
        let counts = eventually(Duration::from_millis(300), async || {
            one.resets() != 1 || other.resets() != 1
        })
        .await;
        assert!(counts.is_none(), "a reset counted twice");
    }
    // An empty Redis that never had a directory is no loss.
    let fresh = RedisServer::start();
    let third = directory(&fresh.url());
    synced(&third).await;
    fresh.cli(&["FLUSHALL"]);
    assert!(
        eventually(Duration::from_millis(600), async || third.resets() > 0)
            .await
            .is_none()
    );
}

/// The consumer the key index in Redis names for the key `key`, if any.
fn indexed_owner(redis: &RedisServer, key: &str) -> Option<String> {
    let hex = tollgate::consumers::digest_hex(&digest(key.as_bytes()));
    redis
        .cli(&["HGET", "tollgate:{consumers}:keys", &hex])
        .filter(|owner| !owner.is_empty())
}

#[tokio::test]
async fn the_key_index_follows_every_change_and_a_key_is_found_through_it() {
    let redis = RedisServer::start();
    let one = directory(&redis.url());
    synced(&one).await;
    let (first, first_key) = one.add_key("acme").await.expect("key");
    let (_, second_key) = one.add_key("acme").await.expect("key");
    assert_eq!(indexed_owner(&redis, &first_key).as_deref(), Some("acme"));
    assert_eq!(
        redis
            .cli(&["EXISTS", "tollgate:{consumers}:indexed"])
            .as_deref(),
        Some("1"),
        "a directory started by this version has a complete index"
    );
    assert!(one.revoke_key("acme", &first.id).await.expect("revoke"));
    assert_eq!(indexed_owner(&redis, &first_key), None);
    assert_eq!(indexed_owner(&redis, &second_key).as_deref(), Some("acme"));
    // An import moves a key to another consumer: the index names the new holder only.
    let moved = one.consumer("acme").expect("record").keys.clone();
    let record = ConsumerRecord {
        keys: moved,
        ..plan("pro")
    };
    one.import(vec![
        ("globex".to_owned(), record),
        ("acme".to_owned(), plan("free")),
    ])
    .await
    .expect("import");
    assert_eq!(
        indexed_owner(&redis, &second_key).as_deref(),
        Some("globex")
    );

    // Another instance looks a key up through the index (as it does before it has read the directory whole).
    let other = directory(&redis.url());
    other
        .read_through_key(&digest(second_key.as_bytes()))
        .await
        .expect("lookup");
    assert_eq!(
        other.key_owner(&digest(second_key.as_bytes())),
        Known::Is("globex".into())
    );
    one.delete("globex").await.expect("delete");
    assert_eq!(indexed_owner(&redis, &second_key), None);
}

#[tokio::test]
async fn a_directory_written_before_the_key_index_is_indexed_by_the_first_full_read() {
    let redis = RedisServer::start();
    // Records as an earlier version wrote them: no index, no mark.
    for (id, key) in [("acme", "tg_old_a"), ("globex", "tg_old_g")] {
        let hex = tollgate::consumers::digest_hex(&digest(key.as_bytes()));
        let json =
            format!(r#"{{"plan":"pro","keys":[{{"id":"k_1","sha256":"{hex}","created_ms":1}}]}}"#);
        redis.cli(&["HSET", "tollgate:{consumers}", id, &json]);
    }
    redis.cli(&["INCR", "tollgate:{consumers}:version"]);
    let one = directory(&redis.url());
    synced(&one).await;
    let indexed = eventually(ONE_SECOND * 5, async || {
        redis
            .cli(&["EXISTS", "tollgate:{consumers}:indexed"])
            .as_deref()
            == Some("1")
    })
    .await;
    assert!(indexed.is_some(), "the index was never marked complete");
    assert_eq!(indexed_owner(&redis, "tg_old_a").as_deref(), Some("acme"));
    assert_eq!(indexed_owner(&redis, "tg_old_g").as_deref(), Some("globex"));
}
