//! The Kubernetes manifests of `examples/kubernetes/` parse as Kubernetes objects and
//! hold what running a job as members relies on: one pod per member, started and
//! stopped together, the member index from the pod name, probes on the job's listener,
//! time for the final checkpoint at SIGTERM, every secret it names, and a job file that
//! lockgate's own parser accepts. (Applying them needs a cluster: not tested here.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes")
}

/// Every object of every manifest, by kind.
fn objects() -> BTreeMap<String, Yaml> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in
            YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        {
            let kind = doc["kind"]
                .as_str()
                .expect("every object has a kind")
                .to_string();
            assert!(doc["apiVersion"].as_str().is_some(), "{}", path.display());
            assert!(
                doc["metadata"]["name"].as_str().is_some(),
                "{}",
                path.display()
            );
            assert!(out.insert(kind.clone(), doc).is_none(), "one {kind}");
        }
    }
    out
}

fn strs(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .unwrap_or_else(|| panic!("a list: {y:?}"))
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect()
}

#[test]
fn the_statefulset_runs_one_member_per_pod_with_probes_and_time_for_a_final_checkpoint() {
    let o = objects();
    let kinds: Vec<&str> = o.keys().map(String::as_str).collect();
    assert_eq!(kinds, ["ConfigMap", "Secret", "Service", "StatefulSet"]);
    let sts = &o["StatefulSet"];
    let spec = &sts["spec"];
    assert_eq!(sts["apiVersion"].as_str(), Some("apps/v1"));
    assert_eq!(spec["podManagementPolicy"].as_str(), Some("Parallel"));
    // Pod names NAME-I come from the governing service.
    assert_eq!(
        spec["serviceName"].as_str(),
        o["Service"]["metadata"]["name"].as_str()
    );
    assert_eq!(o["Service"]["spec"]["clusterIP"].as_str(), Some("None"));
    let labels = &spec["template"]["metadata"]["labels"];
    for (k, v) in spec["selector"]["matchLabels"].as_hash().unwrap() {
        assert_eq!(
            &labels[k.as_str().unwrap()],
            v,
            "the selector selects the pods"
        );
    }
    let pod = &spec["template"]["spec"];
    let containers = pod["containers"].as_vec().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let args = strs(&c["args"]);
    assert_eq!(&args[..3], ["run", "--config", "/etc/lockgate/job.toml"]);
    assert!(
        args.contains(&"--member-from-hostname".to_string()),
        "{args:?}"
    );
    let members = args
        .iter()
        .position(|a| a == "--members")
        .map(|i| args[i + 1].parse::<i64>().unwrap())
        .expect("--members");
    assert_eq!(
        spec["replicas"].as_i64(),
        Some(members),
        "replicas and --members agree"
    );

    // The job file, as lockgate reads it, from the ConfigMap mounted at /etc/lockgate.
    let mounts = c["volumeMounts"].as_vec().unwrap();
    let mount_of = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"].as_str() == Some(name))
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("volume {name} is mounted"))
            .to_string()
    };
    let volumes = pod["volumes"].as_vec().unwrap();
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("volume {name}"))
    };
    let cm_volume = volumes
        .iter()
        .find(|v| v["configMap"]["name"].as_str() == o["ConfigMap"]["metadata"]["name"].as_str())
        .expect("the ConfigMap is a volume");
    assert_eq!(
        mount_of(cm_volume["name"].as_str().unwrap()),
        "/etc/lockgate"
    );
    let job_text = o["ConfigMap"]["data"]["job.toml"].as_str().unwrap();

    // Every secret the pod names exists in the Secret.
    let secret_name = o["Secret"]["metadata"]["name"].as_str().unwrap();
    let secret_data = o["Secret"]["stringData"].as_hash().unwrap();
    let has_key = |k: &str| secret_data.contains_key(&Yaml::String(k.into()));
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in c["env"].as_vec().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else {
            let r = &e["valueFrom"]["secretKeyRef"];
            assert_eq!(r["name"].as_str(), Some(secret_name), "{name}");
            let key = r["key"].as_str().unwrap();
            assert!(has_key(key), "{name}: the Secret has {key}");
            secret_data[&Yaml::String(key.into())]
                .as_str()
                .unwrap()
                .to_string()
        };
        env.insert(name, value);
    }
    let secrets_volume = volume("secrets");
    assert_eq!(
        secrets_volume["secret"]["secretName"].as_str(),
        Some(secret_name)
    );
    let secrets_dir = mount_of("secrets");
    for item in secrets_volume["secret"]["items"].as_vec().unwrap() {
        assert!(has_key(item["key"].as_str().unwrap()));
    }

    // Materialize the pod's view: the job file, the mounted secret files, the env.
    let tmp = tempfile::tempdir().unwrap();
    let rooted = |p: &str| tmp.path().join(p.trim_start_matches('/'));
    let job_path = rooted("/etc/lockgate/job.toml");
    std::fs::create_dir_all(job_path.parent().unwrap()).unwrap();
    for item in secrets_volume["secret"]["items"].as_vec().unwrap() {
        let file = rooted(&format!("{secrets_dir}/{}", item["path"].as_str().unwrap()));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let value = secret_data[&item["key"]].as_str().unwrap();
        std::fs::write(file, value).unwrap();
    }
    // The job file's absolute paths point into the pod: re-root them here.
    let work_dir = mount_of("work");
    let pod_text = job_text
        .replace(
            &format!("\"{secrets_dir}"),
            &format!("\"{}", rooted(&secrets_dir).display()),
        )
        .replace(
            &format!("\"{work_dir}"),
            &format!("\"{}", rooted(&work_dir).display()),
        );
    std::fs::write(&job_path, &pod_text).unwrap();
    for name in [
        "KAFKA_PASSWORD",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        assert!(env.contains_key(name), "{name} is in the pod's environment");
    }
    for var in pod_text.split("${").skip(1) {
        let name = var.split('}').next().unwrap();
        assert!(env.contains_key(name), "${{{name}}} is set by the pod");
        std::env::set_var(name, &env[name]);
    }
    let job = lockgate::config::load(&job_path, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        job.co_partitioned,
        "a job with keyed state runs as members only co-partitioned"
    );
    // Members on other machines share the checkpoints through the object store; the
    // local staging directory is on the pod's writable work volume.
    let store = job
        .checkpoint
        .store
        .as_ref()
        .expect("checkpoint.dir is a store");
    assert_eq!(store.scheme(), "s3", "{store}");
    let work = mount_of("work");
    assert!(
        job.checkpoint.dir.starts_with(rooted(&work)),
        "local_dir {} is on the work volume {work}",
        job.checkpoint.dir.display()
    );
    assert!(volume("work")["emptyDir"].as_hash().is_some());

    // The probes reach the job's listener.
    let listen: std::net::SocketAddr = job.metrics_listen.expect("[metrics] listen");
    assert!(
        listen.ip().is_unspecified(),
        "the kubelet probes the pod's IP"
    );
    let ports = c["ports"].as_vec().unwrap();
    let port = &ports[0];
    assert_eq!(
        port["containerPort"].as_i64(),
        Some(i64::from(listen.port()))
    );
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"], port["name"], "{probe}");
    }
    // SIGTERM completes a final checkpoint: the grace period outlasts its timeout.
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    assert!(
        grace * 1000 >= job.checkpoint.timeout_ms as i64 + 10_000,
        "grace {grace} s against checkpoint.timeout_ms {}",
        job.checkpoint.timeout_ms
    );
}
