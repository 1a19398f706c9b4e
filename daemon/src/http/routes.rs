//! Small routes: models, health, readiness, metrics, status and thermal history.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferloop_thermal::{Reading, ThermalState};
use serde_json::json;

use super::error::ApiError;
use super::wire::{ModelCard, ModelList};
use super::AppState;

pub async fn healthz() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// Readiness (also `/health`): 200 only while new work would be taken. 503 while the model
/// loads, once a stop signal started the drain, and while the board is critical (new
/// requests are refused then), so load balancers and routers send the work elsewhere.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let not_ready = |body: serde_json::Value, retry_after: u64| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, retry_after.to_string())],
            Json(body),
        )
            .into_response()
    };
    if *state.stopping.borrow() {
        return not_ready(json!({ "status": "draining" }), 1);
    }
    if state.engine().is_err() {
        return not_ready(json!({ "status": "loading" }), 1);
    }
    if let Some(hot) = state.thermal.gate().refusal() {
        let retry = super::error::OVERHEATED_RETRY_AFTER_SECS;
        return not_ready(
            json!({
                "status": "overheated",
                "celsius": hot.celsius,
                "critical_celsius": hot.critical,
            }),
            retry,
        );
    }
    Json(json!({ "status": "ready" })).into_response()
}

/// `GET /get_load`, as vllm-router's `power_of_two` policy reads it: `load` is the requests
/// running and queued here (it compares boxes by it); the rest is for people. 503 while
/// the model loads, so the router falls back to its own count.
pub async fn load(State(state): State<AppState>) -> Response {
    match state.engine() {
        Ok(engine) => {
            let load = engine.load();
            let cells = u64::from(engine.plan().kv_cells);
            Json(json!({
                "load": load.active + load.queued,
                "running": load.active,
                "queued": load.queued,
                "max_running": load.max_active,
                "kv_cells": cells,
                "kv_free_cells": cells.saturating_sub(load.kv_reserved),
            }))
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /get_server_info`, the fields vllm-router's `kv_aware` discovery reads: the model's
/// identity (boxes serving the same weights share one block index) and the KV block size.
pub async fn server_info(State(state): State<AppState>) -> Response {
    let engine = match state.engine() {
        Ok(engine) => engine,
        Err(e) => return e.into_response(),
    };
    let mut info = json!({
        "model_id": engine.model().info().id,
        "model_path": state.config.model.display().to_string(),
        "instance_id": state.instance_id,
        "context_length": engine.plan().ctx,
        "max_running_requests": engine.plan().slots,
    });
    if let Some(source) = &state.kv_events {
        info["kv_block_size"] = json!(source.block_size);
    }
    Json(info).into_response()
}

/// `GET /kv_event_sources`: where the KV events are published, keyed by data-parallel rank
/// (one here), in vLLM's shape. No rank without `--kv-events`: the router then routes this
/// box on load alone.
pub async fn kv_event_sources(State(state): State<AppState>) -> Response {
    let Some(source) = &state.kv_events else {
        return Json(json!({})).into_response();
    };
    Json(json!({
        "0": {
            "endpoint": source.endpoint,
            "replay_endpoint": null,
            "topic": "",
            "publisher": "zmq",
            "encoding": "msgpack",
            "schema_version": 1,
            "enable_kv_cache_events": true,
        }
    }))
    .into_response()
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

fn card(state: &AppState) -> Result<ModelCard, ApiError> {
    let engine = state.engine()?;
    let info = engine.model().info();
    Ok(ModelCard {
        id: info.id.clone(),
        object: "model",
        created: info.created,
        owned_by: "inferloop",
    })
}

pub async fn models(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    Ok(Json(ModelList {
        object: "list",
        data: vec![card(&state)?],
    }))
}

pub async fn model(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ModelCard>, ApiError> {
    // axum's own rejection is plain text; every error here is the OpenAI shape.
    let Path(id) = id.map_err(|e| ApiError::bad_path(e.body_text()))?;
    let card = card(&state)?;
    if card.id != id {
        return Err(ApiError::model_not_found(&id));
    }
    Ok(Json(card))
}

pub async fn status(State(state): State<AppState>) -> Response {
    let engine = state.engine.borrow().clone();
    let plan = &state.boot.plan;
    let load = engine.as_ref().map(|e| e.load()).unwrap_or_default();
    let max_active = if engine.is_some() {
        load.max_active
    } else {
        plan.slots
    };
    let model = engine.as_ref().map(|e| e.model().info().clone());
    let watch = &state.thermal;
    let board = watch.detection().map(|d| {
        json!({
            "name": d.profile.name,
            "description": d.profile.description,
            "reason": d.reason.to_string(),
            "rule": d.reason.kind(),
        })
    });
    // State and temperature from the one reading shown, so the three always agree.
    let latest = watch.latest();
    let thermal_state = latest
        .as_ref()
        .map_or(ThermalState::Normal, Reading::state_or_normal);
    let celsius = latest
        .as_ref()
        .and_then(|r| watch.driving_celsius(&r.snapshot));
    let mut status = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "ready": engine.is_some(),
        "uptime_s": state.started.elapsed().as_secs_f64(),
        "model": model,
        "backend": &state.boot.selection,
        "slots": {
            "total": plan.slots,
            "active": load.active,
            "idle": plan.slots.saturating_sub(load.active),
            "max_active": max_active,
            "ctx_per_slot": plan.ctx,
        },
        "queue": {
            "depth": load.queued,
            "capacity": plan.queue,
            "timeout_ms": plan.queue_timeout.as_millis() as u64,
        },
        "kv": {
            "cells": plan.kv_cells,
            "reserved": load.kv_reserved,
            "shared": plan.shared_kv,
            // `{"k": "q8_0", "v": "q8_0"}`: the element types the cells hold.
            "type": plan.kv_type,
            "cell_bytes": crate::engine::footprint::kv_cell_bytes(
                &state.boot.decision.shape,
                plan.kv_type,
            ),
        },
        "prefix_cache": prefix_cache_status(plan, &state.metrics),
        "speculative": spec_status(plan, state.config.draft_model.as_deref(), &state.metrics),
        "memory": {
            "fits": state.boot.decision.fits,
            "required_bytes": state.boot.decision.required_bytes,
            "expected_peak_bytes": state.boot.decision.expected_peak_bytes,
            "terms": &state.boot.decision.ledger.terms,
            "limit": &state.boot.decision.limit,
            "limits": &state.boot.decision.limits,
            "rss_bytes": crate::ledger::rss_bytes(),
            "peak_rss_bytes": crate::ledger::peak_rss_bytes(),
        },
        "integrity": {
            "manifest_sha256": &state.boot.manifest_sha256,
            "weights_sha256": &state.boot.pinned_sha256,
            "weights_sha256_observed": state.boot.observed_sha256.get(),
        },
        "board": board,
        "thermal": {
            "state": thermal_state,
            "celsius": celsius,
            "hot_celsius": watch.admission().hot_c,
            "critical_celsius": watch.admission().critical_c,
            "hysteresis_celsius": watch.admission().hysteresis_c,
            "hot_fraction": watch.admission().hot_fraction,
            "zones": &watch.admission().zones,
            // A reading serializes as its snapshot plus `thermal_state`.
            "snapshot": latest,
        },
        "threads": plan.threads,
        "requests": {
            "generated_tokens_total": state.metrics.generated_tokens_total.get(),
            "prompt_tokens_total": state.metrics.prompt_tokens_total.get(),
            "cancelled_total": state.metrics.cancelled_total.get(),
        },
    });
    // The backend's own details, keyed by backend (null for those not serving).
    if let Some(map) = status.as_object_mut() {
        for (key, details) in state.boot.selection.status_details() {
            map.insert(key.into(), details);
        }
    }
    Json(status).into_response()
}

/// The kept thermal readings, oldest first (`GET /v1/thermal`).
pub async fn thermal(State(state): State<AppState>) -> Response {
    let watch = &state.thermal;
    let readings = watch.history();
    let thermal_state = readings
        .last()
        .map_or(ThermalState::Normal, Reading::state_or_normal);
    Json(json!({
        "state": thermal_state,
        "interval_ms": watch.interval().as_millis() as u64,
        "capacity": crate::thermal::HISTORY,
        "history": readings,
    }))
    .into_response()
}

/// `/v1/status` `speculative`: the mode and how much of what was drafted was accepted.
/// With `--spec draft`, also the draft model's path.
fn spec_status(
    plan: &crate::engine::EnginePlan,
    draft_model: Option<&std::path::Path>,
    metrics: &crate::metrics::Metrics,
) -> serde_json::Value {
    // Accepted first: a verification counts its drafts before what it accepted, so read in
    // this order `accepted ≤ drafted` holds even while steps run.
    let accepted = metrics.spec_accepted_tokens_total.get();
    let drafted = metrics.spec_drafted_tokens_total.get();
    json!({
        "mode": plan.spec,
        "draft_model": draft_model.map(|p| p.display().to_string()),
        "gate": plan.spec_gate,
        "max_draft": crate::engine::plan::MAX_DRAFT,
        "drafted_tokens_total": drafted,
        "accepted_tokens_total": accepted,
        "acceptance_rate": if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 },
    })
}

/// Prompt reuse so far: tokens looked up, tokens found resident, their ratio.
fn prefix_cache_status(
    plan: &crate::engine::EnginePlan,
    metrics: &crate::metrics::Metrics,
) -> serde_json::Value {
    let lookup = metrics.prefix_lookup_tokens_total.get();
    let hit = metrics.prefix_hit_tokens_total.get();
    json!({
        "enabled": plan.prefix_cache.enabled(),
        "mode": plan.prefix_cache,
        "prefix_slots": plan.prefix_slots,
        "lookup_tokens": lookup,
        "hit_tokens": hit,
        "hit_rate": if lookup > 0 { hit as f64 / lookup as f64 } else { 0.0 },
        "retained_cells": metrics.prefix_retained_cells.get(),
        "tiers": tiers_status(&plan.prompt_cache, &metrics.prompt_cache),
    })
}

/// The prompt cache's RAM and disk tiers: budgets, what they hold, what they restored.
fn tiers_status(
    plan: &crate::engine::prompt_cache::TiersPlan,
    series: &crate::metrics::PromptCacheSeries,
) -> serde_json::Value {
    let (bytes, entries, hit_tokens) = series.tier("ram");
    let ram = json!({
        "budget_bytes": plan.ram_bytes,
        "bytes": bytes,
        "entries": entries,
        "hit_tokens": hit_tokens,
    });
    let disk = plan.disk.as_ref().map(|d| {
        let (bytes, entries, hit_tokens) = series.tier("disk");
        json!({
            "dir": d.dir,
            "budget_bytes": d.bytes,
            "ready": series.disk_ready(),
            "bytes": bytes,
            "entries": entries,
            "hit_tokens": hit_tokens,
        })
    });
    json!({"ram": ram, "disk": disk})
}
