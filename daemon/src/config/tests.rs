//! Unit tests of the config layers, their precedence and the checks on the merged result.

use super::*;
use crate::engine::EnginePlan;
use inferloop_board::Roots;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> ServeLayer {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ServeLayer::from_env(|k| map.get(k).cloned()).expect("valid env")
}

fn file(text: &str) -> ServeLayer {
    toml::from_str(text).expect("toml")
}

#[test]
fn flag_beats_env() {
    let flags = ServeLayer {
        port: Some(2000),
        hot_celsius: Some(75.0),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(
        None,
        flags,
        env(&[("INFERLOOP_PORT", "3000"), ("INFERLOOP_HOT_CELSIUS", "80")]),
    )
    .expect("valid");
    assert_eq!(cfg.port, 2000);
    assert_eq!(cfg.thermal.hot_c, Some(75.0));
}

#[test]
fn flag_beats_file() {
    let flags = ServeLayer {
        slots: Some(3),
        ctx: Some(1024),
        ..ServeLayer::default()
    };
    let cfg =
        ServeConfig::resolve(Some(file("slots = 2\nctx = 512\n")), flags, env(&[])).expect("valid");
    assert_eq!((cfg.slots, cfg.ctx), (3, 1024));
}

#[test]
fn env_beats_file() {
    let cfg = ServeConfig::resolve(
        Some(file("ctx = 512\nhot_celsius = 70.0\n")),
        ServeLayer::default(),
        env(&[("INFERLOOP_CTX", "1024"), ("INFERLOOP_HOT_CELSIUS", "72")]),
    )
    .expect("valid");
    assert_eq!(cfg.ctx, 1024);
    assert_eq!(cfg.thermal.hot_c, Some(72.0));
}

#[test]
fn flag_beats_env_and_file_when_all_three_set_a_key() {
    let flags = ServeLayer {
        port: Some(2000),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(
        Some(file("port = 1000\n")),
        flags,
        env(&[("INFERLOOP_PORT", "3000")]),
    )
    .expect("valid");
    assert_eq!(cfg.port, 2000);
}

#[test]
fn default_applies_when_no_layer_sets_a_key() {
    // Each layer sets some other key, so none of the four below is set anywhere.
    let flags = ServeLayer {
        queue: Some(8),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(
        Some(file("threads = 2\n")),
        flags,
        env(&[("INFERLOOP_READ_TIMEOUT_SECS", "5")]),
    )
    .expect("valid");
    assert_eq!((cfg.port, cfg.slots, cfg.ctx), (8080, 4, 2048));
    assert_eq!(cfg.thermal.hot_c, None);
    assert_eq!((cfg.queue, cfg.threads), (8, 2));
    assert_eq!(cfg.read_timeout, Duration::from_secs(5));
}

/// A manifest pinning `weights` (relative to the manifest's directory).
fn write_manifest(dir: &Path, weights: &str) -> PathBuf {
    let path = dir.join("manifest.json");
    let json = format!(
        r#"{{"schema": 1, "model": {{"path": "{weights}", "sha256": "{}", "size": 1}}}}"#,
        "0".repeat(64)
    );
    std::fs::write(&path, json).expect("write manifest");
    path
}

#[test]
fn manifest_is_read_once_and_names_the_weights_without_model() {
    let dir = tempfile::tempdir().expect("tmp");
    let manifest = write_manifest(dir.path(), "pinned.gguf");
    let flags = ServeLayer {
        manifest: Some(manifest.clone()),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(None, flags, ServeLayer::default()).expect("valid");
    assert_eq!(cfg.model, dir.path().join("pinned.gguf"));
    assert_eq!(cfg.model_id, "pinned");
    let loaded = match &cfg.loaded_manifest {
        Some(Ok(loaded)) => loaded,
        other => panic!("expected the loaded manifest, got {other:?}"),
    };
    assert_eq!(loaded.path, manifest);
    assert_eq!(loaded.manifest.model.path, "pinned.gguf");
}

#[test]
fn broken_manifest_is_kept_for_the_boot_gate_not_raised() {
    let dir = tempfile::tempdir().expect("tmp");
    let manifest = dir.path().join("manifest.json");
    std::fs::write(&manifest, "{ not json").expect("write");
    let flags = ServeLayer {
        manifest: Some(manifest),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(None, flags, ServeLayer::default()).expect("resolves");
    assert_eq!(cfg.model, PathBuf::from(DEFAULT_MODEL));
    assert!(
        matches!(
            cfg.loaded_manifest
                .as_ref()
                .map(|l| l.as_ref().map_err(|e| &**e)),
            Some(Err(IntegrityError::ManifestParse { .. }))
        ),
        "{:?}",
        cfg.loaded_manifest
    );
}

#[test]
fn no_manifest_means_nothing_loaded() {
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), ServeLayer::default())
        .expect("defaults are valid");
    // Unless an image baked one in where the daemon looks unasked.
    if !Path::new(DEFAULT_MANIFEST).is_file() {
        assert!(cfg.manifest.is_none() && cfg.loaded_manifest.is_none());
    }
}

#[test]
fn unreadable_file_prints_the_os_error_once() {
    let err =
        ServeLayer::from_file(Path::new("/nonexistent/inferloop.toml")).expect_err("no such file");
    let printed = format!("{:#}", anyhow::Error::from(err));
    let os = std::io::Error::from_raw_os_error(2).to_string();
    assert_eq!(printed.matches(&os).count(), 1, "{printed}");
    assert!(printed.contains("/nonexistent/inferloop.toml"), "{printed}");
}

#[test]
fn unknown_key_in_file_is_rejected() {
    let err = toml::from_str::<ServeLayer>("prot = 1").expect_err("unknown key");
    assert!(err.to_string().contains("prot"), "{err}");
}

#[test]
fn model_id_defaults_to_file_stem() {
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), ServeLayer::default())
        .expect("defaults are valid");
    assert_eq!(cfg.model_id, "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(cfg.host, IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(cfg.max_body_bytes, 1 << 20);
}

#[test]
fn public_bind_without_key_is_refused() {
    let flags = ServeLayer {
        host: Some("0.0.0.0".parse().expect("ip")),
        ..ServeLayer::default()
    };
    let err =
        ServeConfig::resolve(None, flags.clone(), ServeLayer::default()).expect_err("must refuse");
    assert!(matches!(err, ConfigError::UnauthenticatedBind { .. }));
    let insecure = ServeLayer {
        insecure_no_auth: Some(true),
        ..flags.clone()
    };
    assert!(ServeConfig::resolve(None, insecure, ServeLayer::default()).is_ok());
    let keyed = ServeLayer {
        api_key: Some("k".into()),
        ..flags
    };
    assert!(ServeConfig::resolve(None, keyed, ServeLayer::default()).is_ok());
}

#[test]
fn bad_env_value_names_the_variable() {
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_SLOTS").then(|| "many".to_string()))
        .expect_err("not a number");
    assert!(err.to_string().contains("INFERLOOP_SLOTS"), "{err}");
}

#[test]
fn thermal_keys_layer_like_the_others() {
    let file: ServeLayer = toml::from_str(
        "board = \"jetson-orin-nx-16gb\"\nsysfs_root = \"/fixture/sys\"\n\
         hot_celsius = 70.0\ncritical_celsius = 90.0\nthermal_interval_ms = 500\n",
    )
    .expect("toml");
    let flags = ServeLayer {
        hot_celsius: Some(75.0),
        hot_fraction: Some(0.25),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(
        Some(file),
        flags,
        env(&[
            ("INFERLOOP_CRITICAL_CELSIUS", "95"),
            ("INFERLOOP_PROC_ROOT", "/fixture/proc"),
            ("INFERLOOP_HYSTERESIS_CELSIUS", "2.5"),
        ]),
    )
    .expect("valid");
    let t = &cfg.thermal;
    assert_eq!(t.board.as_deref(), Some("jetson-orin-nx-16gb"));
    assert_eq!(t.roots.sys_root, PathBuf::from("/fixture/sys"));
    assert_eq!(t.roots.proc_root, PathBuf::from("/fixture/proc"));
    assert_eq!((t.hot_c, t.critical_c), (Some(75.0), Some(95.0)));
    assert_eq!(t.hysteresis_c, Some(2.5));
    assert_eq!(t.hot_fraction, 0.25);
    assert_eq!(t.interval, Duration::from_millis(500));
}

#[test]
fn thermal_defaults_read_the_real_roots_every_second() {
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), ServeLayer::default())
        .expect("defaults are valid");
    assert_eq!(cfg.thermal, ThermalSettings::default());
    assert_eq!(cfg.thermal.roots, Roots::default());
    assert_eq!(cfg.thermal.interval, Duration::from_secs(1));
    assert_eq!(cfg.thermal.hot_fraction, 0.5);
    assert_eq!((cfg.thermal.hot_c, cfg.thermal.critical_c), (None, None));
}

#[test]
fn out_of_range_thermal_values_name_the_field() {
    let cases: [(ServeLayer, &str); 8] = [
        (
            ServeLayer {
                hot_celsius: Some(200.0),
                ..ServeLayer::default()
            },
            "`hot_celsius`",
        ),
        (
            ServeLayer {
                critical_celsius: Some(f64::NAN),
                ..ServeLayer::default()
            },
            "`critical_celsius`",
        ),
        (
            ServeLayer {
                hot_celsius: Some(90.0),
                critical_celsius: Some(80.0),
                ..ServeLayer::default()
            },
            "`critical_celsius`",
        ),
        (
            ServeLayer {
                hysteresis_celsius: Some(-1.0),
                ..ServeLayer::default()
            },
            "`hysteresis_celsius`",
        ),
        (
            ServeLayer {
                hot_fraction: Some(0.0),
                ..ServeLayer::default()
            },
            "`hot_fraction`",
        ),
        (
            ServeLayer {
                hot_fraction: Some(1.5),
                ..ServeLayer::default()
            },
            "`hot_fraction`",
        ),
        (
            ServeLayer {
                thermal_interval_ms: Some(0),
                ..ServeLayer::default()
            },
            "`thermal_interval_ms`",
        ),
        (
            ServeLayer {
                board: Some(" ".into()),
                ..ServeLayer::default()
            },
            "`board`",
        ),
    ];
    for (flags, field) in cases {
        let err =
            ServeConfig::resolve(None, flags, ServeLayer::default()).expect_err("out of range");
        assert!(
            matches!(err, ConfigError::Invalid { .. }) && err.to_string().contains(field),
            "{field}: {err}"
        );
    }
}

#[test]
fn bad_thermal_env_value_names_the_variable() {
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_HOT_CELSIUS").then(|| "warm".to_string()))
        .expect_err("not a number");
    assert!(err.to_string().contains("INFERLOOP_HOT_CELSIUS"), "{err}");
}

fn refusal(flags: ServeLayer, env_pairs: &[(&str, &str)]) -> String {
    match ServeConfig::resolve(None, flags, env(env_pairs)) {
        Err(e @ ConfigError::Invalid { .. }) => e.to_string(),
        other => panic!("expected an invalid setting, got {other:?}"),
    }
}

#[test]
fn memory_sizes_that_overflow_bytes_are_refused_not_wrapped() {
    let margin = refusal(
        ServeLayer {
            memory_margin_mb: Some(u64::MAX),
            ..ServeLayer::default()
        },
        &[],
    );
    assert!(
        margin.contains("`memory_margin_mb`") && margin.contains("18446744073709551615"),
        "{margin}"
    );
    // 2^44 MiB shifted to bytes is 2^64, which wrapped to a 0-byte limit.
    let budget = refusal(
        ServeLayer::default(),
        &[("INFERLOOP_MEMORY_BUDGET_MB", "17592186044416")],
    );
    assert!(budget.contains("`memory_budget_mb`"), "{budget}");
    let largest = ServeConfig::resolve(
        None,
        ServeLayer {
            memory_budget_mb: Some(MAX_MIB),
            memory_margin_mb: Some(MAX_MIB),
            ..ServeLayer::default()
        },
        ServeLayer::default(),
    )
    .expect("the largest size is valid");
    assert_eq!(largest.memory_budget, Some(MAX_MIB << 20));
    assert!(largest.memory_margin.is_some_and(|b| b <= i64::MAX as u64));
}

#[test]
fn timeouts_past_a_year_are_refused_before_a_deadline_overflows() {
    for (flags, field) in [
        (
            ServeLayer {
                queue_timeout_ms: Some(u64::MAX),
                ..ServeLayer::default()
            },
            "`queue_timeout_ms`",
        ),
        (
            ServeLayer {
                read_timeout_secs: Some(u64::MAX),
                ..ServeLayer::default()
            },
            "`read_timeout_secs`",
        ),
        (
            ServeLayer {
                shutdown_timeout_secs: Some(MAX_WAIT.as_secs() + 1),
                ..ServeLayer::default()
            },
            "`shutdown_timeout`",
        ),
    ] {
        let err = refusal(flags, &[]);
        assert!(err.contains(field), "{field}: {err}");
    }
    let year = ServeConfig::resolve(
        None,
        ServeLayer {
            read_timeout_secs: Some(MAX_WAIT.as_secs()),
            ..ServeLayer::default()
        },
        ServeLayer::default(),
    )
    .expect("a year is the limit, not over it");
    assert_eq!(year.read_timeout, MAX_WAIT);
}

#[test]
fn api_key_no_client_can_send_is_refused_from_every_layer() {
    let public = ServeLayer {
        host: Some("0.0.0.0".parse().expect("ip")),
        ..ServeLayer::default()
    };
    let flag = refusal(
        ServeLayer {
            api_key: Some("   ".into()),
            ..public.clone()
        },
        &[],
    );
    assert!(
        flag.contains("`api_key`") && flag.contains("whitespace"),
        "{flag}"
    );
    let from_env = refusal(public.clone(), &[("INFERLOOP_API_KEY", "\t \n")]);
    assert!(from_env.contains("INFERLOOP_API_KEY"), "{from_env}");
    let file: ServeLayer = toml::from_str("api_key = \" \"\n").expect("toml");
    let err = ServeConfig::resolve(Some(file), public.clone(), ServeLayer::default())
        .expect_err("blank key in the file");
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                field: "api_key",
                ..
            }
        ),
        "{err}"
    );
    for unsendable in [" secret", "secret\n", "sécret", "sec\u{7}ret"] {
        let err = refusal(
            ServeLayer {
                api_key: Some(unsendable.into()),
                ..public.clone()
            },
            &[],
        );
        assert!(
            !err.contains("ecret"),
            "the message must not quote the key: {err}"
        );
    }
    let cfg = ServeConfig::resolve(
        None,
        ServeLayer {
            api_key: Some("sk-a b~c".into()),
            ..public
        },
        ServeLayer::default(),
    )
    .expect("a sendable key");
    assert_eq!(cfg.api_key.as_deref(), Some("sk-a b~c"));
}

#[test]
fn out_of_range_values_name_the_field() {
    let flags = ServeLayer {
        slots: Some(0),
        ..ServeLayer::default()
    };
    let err = ServeConfig::resolve(None, flags, ServeLayer::default()).expect_err("0 slots");
    assert!(err.to_string().contains("`slots`"), "{err}");
}

#[test]
fn prefix_cache_is_on_by_default_and_switched_off_from_any_layer() {
    let resolve = |file_layer: Option<ServeLayer>, flags: ServeLayer, env_layer: ServeLayer| {
        ServeConfig::resolve(file_layer, flags, env_layer)
            .expect("valid")
            .prefix_cache
            .enabled()
    };
    assert!(resolve(None, ServeLayer::default(), ServeLayer::default()));
    assert!(!resolve(
        Some(file("prefix_cache = \"off\"\n")),
        ServeLayer::default(),
        ServeLayer::default()
    ));
    assert!(!resolve(
        None,
        ServeLayer::default(),
        env(&[("INFERLOOP_PREFIX_CACHE", "OFF")])
    ));
    let on = ServeLayer {
        prefix_cache: Some(PrefixCache::On),
        ..ServeLayer::default()
    };
    assert!(resolve(None, on, env(&[("INFERLOOP_PREFIX_CACHE", "off")])));
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_PREFIX_CACHE").then(|| "maybe".into()))
        .expect_err("neither on nor off");
    assert!(err.to_string().contains("INFERLOOP_PREFIX_CACHE"), "{err}");
    let mode = |layer: ServeLayer| {
        ServeConfig::resolve(None, layer, ServeLayer::default())
            .expect("valid")
            .prefix_cache
    };
    assert_eq!(mode(ServeLayer::default()), PrefixCache::On, "the default");
    assert_eq!(
        mode(env(&[("INFERLOOP_PREFIX_CACHE", "Exact")])),
        PrefixCache::Exact
    );
    assert_eq!(mode(file("prefix_cache = \"exact\"\n")), PrefixCache::Exact);
    // `relaxed`, the old name of today's `on`, still reads from every layer.
    let from_env = env(&[("INFERLOOP_PREFIX_CACHE", "Relaxed")]);
    assert_eq!(mode(from_env), PrefixCache::On);
    let from_file = file("prefix_cache = \"relaxed\"\n");
    assert_eq!(mode(from_file), PrefixCache::On);
}

#[test]
fn speculation_is_ngram_by_default_set_from_any_layer_and_draft_needs_a_draft_model() {
    let spec = |file_layer: Option<ServeLayer>, flags: ServeLayer, env_layer: ServeLayer| {
        ServeConfig::resolve(file_layer, flags, env_layer)
            .map(|c| c.spec)
            .map_err(|e| e.to_string())
    };
    let none = ServeLayer::default;
    assert_eq!(spec(None, none(), none()), Ok(Spec::Ngram), "the default");
    assert_eq!(
        spec(Some(file("spec = \"off\"\n")), none(), none()),
        Ok(Spec::Off)
    );
    let from_env = env(&[("INFERLOOP_SPEC", "OFF")]);
    assert_eq!(spec(None, none(), from_env), Ok(Spec::Off));
    // The flag wins over the environment.
    let flag = ServeLayer {
        spec: Some(Spec::Ngram),
        ..none()
    };
    assert_eq!(
        spec(None, flag, env(&[("INFERLOOP_SPEC", "off")])),
        Ok(Spec::Ngram)
    );
    // `draft` without a model to draft with is refused, by its field.
    let draft = spec(None, none(), env(&[("INFERLOOP_SPEC", "draft")])).expect_err("no model");
    assert!(
        draft.contains("`spec`") && draft.contains("--draft-model"),
        "{draft}"
    );
    // A draft model makes `draft` the default, from any layer; an explicit mode wins and
    // leaves the draft model unloaded.
    let resolve = |file_layer: Option<ServeLayer>, flags: ServeLayer, env_layer: ServeLayer| {
        ServeConfig::resolve(file_layer, flags, env_layer)
            .map(|c| (c.spec, c.draft_model))
            .map_err(|e| e.to_string())
    };
    let small = Some(std::path::PathBuf::from("small.gguf"));
    assert_eq!(
        resolve(
            None,
            none(),
            env(&[("INFERLOOP_DRAFT_MODEL", "small.gguf")])
        ),
        Ok((Spec::Draft, small.clone()))
    );
    assert_eq!(
        resolve(Some(file("draft_model = \"small.gguf\"\n")), none(), none()),
        Ok((Spec::Draft, small.clone()))
    );
    let off_with_model = ServeLayer {
        spec: Some(Spec::Off),
        draft_model: small.clone(),
        ..none()
    };
    assert_eq!(resolve(None, off_with_model, none()), Ok((Spec::Off, None)));
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_SPEC").then(|| "eagle".into()))
        .expect_err("no such mode");
    assert!(err.to_string().contains("INFERLOOP_SPEC"), "{err}");
    assert!(toml::from_str::<ServeLayer>("spec = \"eagle\"\n").is_err());
}

#[test]
fn prefix_slots_come_from_any_layer_are_bounded_and_need_the_cache() {
    let resolve = |file_layer: Option<ServeLayer>, flags: ServeLayer, env_layer: ServeLayer| {
        ServeConfig::resolve(file_layer, flags, env_layer)
            .map_err(|e| e.to_string())
            .and_then(|c| EnginePlan::from_config(&c).map_err(|e| e.to_string()))
            .map(|p| p.prefix_slots)
    };
    let none = ServeLayer::default;
    assert_eq!(resolve(None, none(), none()).ok(), Some(0));
    let from_file = resolve(Some(file("prefix_slots = 3\n")), none(), none());
    assert_eq!(from_file.ok(), Some(3));
    let from_env = resolve(None, none(), env(&[("INFERLOOP_PREFIX_SLOTS", "5")]));
    assert_eq!(from_env.ok(), Some(5));
    let off = ServeLayer {
        prefix_slots: Some(5),
        prefix_cache: Some(PrefixCache::Off),
        ..none()
    };
    assert_eq!(resolve(None, off, none()).ok(), Some(0), "nothing to keep");
    let too_many = ServeLayer {
        prefix_slots: Some(253),
        ..none()
    };
    let err = resolve(None, too_many, none()).expect_err("4 slots + 253 > 256 sequences");
    assert!(err.contains("prefix_slots"), "{err}");
}

#[test]
fn backend_and_device_layer_like_the_others_and_default_to_auto() {
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), env(&[])).expect("valid");
    assert_eq!(
        (cfg.backend, cfg.device),
        (BackendChoice::Auto, DeviceChoice::Auto)
    );
    let cfg = ServeConfig::resolve(
        Some(file("backend = \"llama\"\ndevice = \"cuda\"\n")),
        ServeLayer::default(),
        env(&[]),
    )
    .expect("valid");
    assert_eq!(
        (cfg.backend, cfg.device),
        (BackendChoice::Llama, DeviceChoice::Cuda)
    );
    let cfg = ServeConfig::resolve(
        Some(file("backend = \"llama\"\ndevice = \"cuda\"\n")),
        ServeLayer::default(),
        env(&[("INFERLOOP_BACKEND", "native"), ("INFERLOOP_DEVICE", "CPU")]),
    )
    .expect("valid");
    assert_eq!(
        (cfg.backend, cfg.device),
        (BackendChoice::Native, DeviceChoice::Cpu)
    );
    let flags = ServeLayer {
        backend: Some(BackendChoice::Llama),
        device: Some(DeviceChoice::Auto),
        ..ServeLayer::default()
    };
    let cfg = ServeConfig::resolve(
        Some(file("backend = \"native\"\n")),
        flags,
        env(&[("INFERLOOP_BACKEND", "native"), ("INFERLOOP_DEVICE", "cpu")]),
    )
    .expect("valid");
    assert_eq!(
        (cfg.backend, cfg.device),
        (BackendChoice::Llama, DeviceChoice::Auto)
    );
}

#[test]
fn an_unknown_backend_or_device_names_the_variable_or_fails_the_file() {
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_BACKEND").then(|| "vulkan".to_string()))
        .expect_err("unknown backend");
    let msg = err.to_string();
    assert!(
        msg.contains("INFERLOOP_BACKEND") && msg.contains("`auto`, `llama` or `native`"),
        "{msg}"
    );
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_DEVICE").then(|| "tpu".to_string()))
        .expect_err("unknown device");
    assert!(err.to_string().contains("INFERLOOP_DEVICE"), "{err}");
    assert!(toml::from_str::<ServeLayer>("device = \"tpu\"\n").is_err());
}

#[test]
fn the_debug_stall_file_is_no_file_key() {
    let err = toml::from_str::<ServeLayer>("debug_stall_file = \"/run/stall\"\n")
        .expect_err("test-only hook: environment only");
    assert!(err.to_string().contains("debug_stall_file"), "{err}");
}

#[test]
fn cpu_fallback_comes_from_the_file_the_environment_or_a_bare_flag() {
    let image = "device = \"cuda\"\ncpu_fallback = false\n";
    let cfg =
        ServeConfig::resolve(Some(file(image)), ServeLayer::default(), env(&[])).expect("valid");
    assert_eq!(
        (cfg.device, cfg.cpu_fallback),
        (DeviceChoice::Cuda, Some(false))
    );
    let cfg = ServeConfig::resolve(
        Some(file(image)),
        ServeLayer::default(),
        env(&[("INFERLOOP_CPU_FALLBACK", "true")]),
    )
    .expect("valid");
    assert_eq!(cfg.cpu_fallback, Some(true));
    // `--cpu-fallback` alone means true.
    let cli = <ServeLayer as clap::Args>::augment_args(clap::Command::new("t"))
        .try_get_matches_from(["t", "--cpu-fallback"])
        .expect("parses");
    let flags = <ServeLayer as clap::FromArgMatches>::from_arg_matches(&cli).expect("layer");
    assert_eq!(flags.cpu_fallback, Some(true));
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), env(&[])).expect("valid");
    assert_eq!(cfg.cpu_fallback, None, "unset: the device decides");
}

#[test]
fn cors_origins_come_from_every_layer_and_the_flag_wins() {
    let none = ServeConfig::resolve(None, ServeLayer::default(), env(&[])).expect("valid");
    assert!(none.cors_origins.is_empty());
    let from_file = ServeConfig::resolve(
        Some(file("cors_origin = [\"http://a.lan:3000\", \"*\"]\n")),
        ServeLayer::default(),
        env(&[]),
    )
    .expect("valid");
    assert_eq!(from_file.cors_origins, ["http://a.lan:3000", "*"]);
    let from_env = ServeConfig::resolve(
        Some(file("cors_origin = [\"http://a.lan\"]\n")),
        ServeLayer::default(),
        env(&[("INFERLOOP_CORS_ORIGIN", "http://B.lan, https://c.lan:8443")]),
    )
    .expect("valid");
    assert_eq!(
        from_env.cors_origins,
        ["http://b.lan", "https://c.lan:8443"]
    );
    let flags = ServeLayer {
        cors_origin: Some(vec!["http://d.lan".into()]),
        ..ServeLayer::default()
    };
    let from_flag = ServeConfig::resolve(
        None,
        flags,
        env(&[("INFERLOOP_CORS_ORIGIN", "http://b.lan")]),
    )
    .expect("valid");
    assert_eq!(from_flag.cors_origins, ["http://d.lan"]);
}

#[test]
fn a_cors_origin_with_a_path_or_no_scheme_is_refused() {
    for bad in ["http://a.lan/", "a.lan", "ftp://a.lan", "http://a.lan/page"] {
        let flags = ServeLayer {
            cors_origin: Some(vec![bad.into()]),
            ..ServeLayer::default()
        };
        match ServeConfig::resolve(None, flags, env(&[])) {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "cors_origin", "{bad}"),
            other => panic!("{bad}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn kv_type_comes_from_a_flag_the_environment_or_the_file_for_k_and_v() {
    let parse = |args: &[&str]| {
        let cli = <ServeLayer as clap::Args>::augment_args(clap::Command::new("t"))
            .try_get_matches_from(std::iter::once("t").chain(args.iter().copied()));
        cli.map(|m| {
            <ServeLayer as clap::FromArgMatches>::from_arg_matches(&m)
                .expect("layer")
                .kv_type
        })
    };
    let q8 = KvTypes::both(KvType::Q8_0);
    let q8_f16 = KvTypes {
        k: KvType::Q8_0,
        v: KvType::F16,
    };
    assert_eq!(parse(&["--kv-type", "q8_0"]).expect("parses"), Some(q8));
    assert_eq!(
        parse(&["--kv-type", "Q8_0,f16"]).expect("parses"),
        Some(q8_f16)
    );
    for bad in ["q5_1", "q8_0,", "f16,q8_0,q4_0", ""] {
        let err = parse(&["--kv-type", bad]).expect_err(bad).to_string();
        assert!(
            err.contains("expected `f16`, `q8_0` or `q4_0`"),
            "{bad}: {err}"
        );
    }
    let cfg = ServeConfig::resolve(None, ServeLayer::default(), env(&[])).expect("valid");
    assert_eq!(cfg.kv_type, KvTypes::F16, "the default");
    let from_file = file("kv_type = \"q4_0\"\n");
    let cfg = ServeConfig::resolve(Some(from_file.clone()), ServeLayer::default(), env(&[]))
        .expect("valid");
    assert_eq!(cfg.kv_type, KvTypes::both(KvType::Q4_0));
    let cfg = ServeConfig::resolve(
        Some(from_file),
        ServeLayer::default(),
        env(&[("INFERLOOP_KV_TYPE", "q8_0,f16")]),
    )
    .expect("valid");
    assert_eq!(cfg.kv_type, q8_f16, "the environment beats the file");
    let flags = ServeLayer {
        kv_type: Some(q8),
        ..ServeLayer::default()
    };
    let cfg =
        ServeConfig::resolve(None, flags, env(&[("INFERLOOP_KV_TYPE", "q4_0")])).expect("valid");
    assert_eq!(cfg.kv_type, q8, "the flag beats the environment");
    assert_eq!(EnginePlan::from_config(&cfg).expect("plan").kv_type, q8);
    let err = ServeLayer::from_env(|k| (k == "INFERLOOP_KV_TYPE").then(|| "q8".into()))
        .expect_err("not a type");
    assert!(err.to_string().contains("INFERLOOP_KV_TYPE"), "{err}");
    assert!(toml::from_str::<ServeLayer>("kv_type = \"int8\"\n").is_err());
}

#[test]
fn kv_types_print_as_the_flag_takes_them() {
    for text in ["f16", "q8_0", "q4_0", "q8_0,f16", "f16,q4_0"] {
        let t: KvTypes = text.parse().expect(text);
        assert_eq!(t.to_string(), text);
    }
    assert_eq!(
        "q8_0,q8_0".parse::<KvTypes>().expect("same").to_string(),
        "q8_0"
    );
    assert_eq!(KvType::Q8_0.row_bytes(192), 204);
    assert_eq!(KvType::Q4_0.row_bytes(192), 108);
    assert_eq!(KvType::F16.row_bytes(192), 384);
}
