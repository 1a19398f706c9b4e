//! `api` cases: `POST /v1/embeddings`: OpenAI's list, unit vectors whose base64 form is the
//! same floats, and a sanity property of the vectors. They keep the ids of three cases
//! folded into their neighbours (the chat and completion id prefixes into
//! `api.chat.object` and `api.completions.object`, the card's `created` into
//! `api.models.card_fields`).

use serde_json::Value;

use super::*;

const EMBEDDINGS: &str = "/v1/embeddings";

/// (sentence, its paraphrase, an unrelated sentence)
const TRIPLES: [(&str, &str, &str); 3] = [
    (
        "The cat sat on the mat.",
        "A cat was sitting on the mat.",
        "The stock market fell sharply today.",
    ),
    (
        "How do I bake bread at home?",
        "What is the way to make bread in my own kitchen?",
        "The train leaves the station at noon.",
    ),
    (
        "I lost my keys somewhere in the house.",
        "Somewhere in the house I have lost my keys.",
        "Photosynthesis converts light into chemical energy.",
    ),
];

/// The vectors of an embeddings answer, in `data` order, checked to be float lists.
fn vectors(v: &Value) -> Result<Vec<Vec<f64>>, Stop> {
    let data = v["data"]
        .as_array()
        .ok_or_else(|| Stop::fail("data: a list", v.to_string()))?;
    data.iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .and_then(|e| e.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                .ok_or_else(|| Stop::fail("embedding: a list of numbers", d.to_string()))
        })
        .collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b))
}

/// Standard base64 with padding (what OpenAI's `encoding_format: base64` sends).
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let keep = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&n.to_be_bytes()[1..1 + keep]);
    }
    Some(out)
}

pub(super) fn register(r: &mut Registry) {
    r.add(
        G,
        "api.completions.id_prefix",
        "POST /v1/embeddings answers OpenAI's list",
        "object list, one embedding object per input with index 0.., vectors of one size > 0, \
         model the served id, usage prompt_tokens == total_tokens > 0",
        |c, ev| {
            let body = json!({"model": c.facts.model_id, "input": ["first input", "the second"]});
            let resp = c.target.post(EMBEDDINGS, &body)?;
            ev.text("response", &crate::case::snippet(&resp.describe(), 1500));
            let v = json_200(&resp, "POST /v1/embeddings")?;
            ensure_eq!("object", v["object"], json!("list"));
            ensure_eq!("model", v["model"], json!(c.facts.model_id));
            for (i, d) in v["data"].as_array().into_iter().flatten().enumerate() {
                ensure_eq!("data[].object", d["object"], json!("embedding"));
                ensure_eq!("data[].index", d["index"], json!(i));
            }
            let vs = vectors(&v)?;
            ensure_eq!("vectors", vs.len(), 2);
            let dim = vs[0].len();
            ensure!(
                dim > 0 && vs[1].len() == dim,
                "two vectors of one size > 0",
                format!("{} and {}", dim, vs[1].len())
            );
            let prompt = u64_at(&v, "/usage/prompt_tokens")?;
            ensure!(
                prompt > 0,
                "usage.prompt_tokens > 0",
                v["usage"].to_string()
            );
            ensure_eq!(
                "usage.total_tokens",
                u64_at(&v, "/usage/total_tokens")?,
                prompt
            );
            Ok(format!("2 vectors of {dim}, {prompt} prompt tokens"))
        },
    );
    r.add(
        G,
        "api.chat.id_prefix",
        "Embeddings are unit vectors, and base64 is the same little-endian f32",
        "|v| within 1e-3 of 1; encoding_format base64 decodes to the float answer's values",
        |c, ev| {
            let body = json!({"model": c.facts.model_id, "input": "Unit length, two encodings."});
            let mut float = body.clone();
            float["encoding_format"] = json!("float");
            let mut b64 = body;
            b64["encoding_format"] = json!("base64");
            let f = json_200(&c.target.post(EMBEDDINGS, &float)?, "float embeddings")?;
            let b = json_200(&c.target.post(EMBEDDINGS, &b64)?, "base64 embeddings")?;
            let v = vectors(&f)?.remove(0);
            let n = norm(&v);
            ev.put("norm", n);
            ensure!((n - 1.0).abs() < 1e-3, "|v| = 1", n.to_string());
            let text = str_at(&b, "/data/0/embedding")?;
            let bytes = base64_decode(&text)
                .ok_or_else(|| Stop::fail("base64 decodes", crate::case::snippet(&text, 200)))?;
            let decoded: Vec<f64> = bytes
                .chunks_exact(4)
                .map(|w| f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            ensure_eq!("decoded length", decoded.len(), v.len());
            let worst = v
                .iter()
                .zip(&decoded)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            ev.put("max_abs_diff", worst);
            ensure!(worst <= 1e-6, "base64 == float", worst.to_string());
            Ok(format!(
                "|v| = {n:.6}, base64 == float ({} values)",
                v.len()
            ))
        },
    );
    r.add(
        G,
        "api.models.created_plausible",
        "A sentence's embedding is closer to its paraphrase than to an unrelated sentence",
        "cosine(sentence, paraphrase) > cosine(sentence, unrelated) for each of 3 triples",
        |c, ev| {
            let mut seen = Vec::new();
            for (s, para, other) in TRIPLES {
                let body = json!({"model": c.facts.model_id, "input": [s, para, other]});
                let v = json_200(&c.target.post(EMBEDDINGS, &body)?, "POST /v1/embeddings")?;
                let vs = vectors(&v)?;
                ensure_eq!("vectors", vs.len(), 3);
                let (near, far) = (cosine(&vs[0], &vs[1]), cosine(&vs[0], &vs[2]));
                seen.push(json!({"sentence": s, "paraphrase": near, "unrelated": far}));
                ensure!(
                    near > far,
                    format!("`{s}` closer to its paraphrase"),
                    format!("paraphrase {near:.4}, unrelated {far:.4}")
                );
            }
            ev.put("cosines", json!(seen));
            Ok("paraphrase closer in 3 of 3".into())
        },
    );
}
