//! The HTTP side of DDI: poll, `configData`, feedback; authentication and TLS.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{Auth, Settings};
use crate::ddi::{Base, ConfigData, Feedback};
use crate::OtaError;

/// Replies longer than this are not DDI JSON.
const MAX_JSON_BYTES: usize = 1 << 20;
const JSON_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct DdiClient {
    http: reqwest::Client,
    base: String,
}

impl DdiClient {
    /// Reads the token and CA files now: a box without them cannot talk to its server.
    pub fn new(settings: &Settings) -> Result<Self, OtaError> {
        let mut headers = HeaderMap::new();
        // A box configured for a token never polls without one: the server could take an
        // unauthenticated poll for a new device, or the operator would see only 401s.
        let token = |setting: &str, path: &std::path::Path| -> Result<String, OtaError> {
            let bad = |message: String| OtaError::Config {
                path: path.to_path_buf(),
                message,
            };
            let t = std::fs::read_to_string(path)
                .map_err(|e| bad(format!("`{setting}` cannot be read: {e}")))?;
            let t = t.trim();
            if t.is_empty() {
                return Err(bad(format!("`{setting}` is empty")));
            }
            if t.chars().any(|c| c.is_control() || c == ' ') {
                return Err(bad(format!(
                    "`{setting}` must hold one token without spaces or line breaks"
                )));
            }
            Ok(t.to_string())
        };
        let auth = match &settings.auth {
            Auth::None => None,
            Auth::Target(p) => Some(format!("TargetToken {}", token("target_token_file", p)?)),
            Auth::Gateway(p) => Some(format!("GatewayToken {}", token("gateway_token_file", p)?)),
        };
        if let Some(a) = auth {
            let mut v = HeaderValue::from_str(&a).map_err(|e| OtaError::Config {
                path: "token".into(),
                message: e.to_string(),
            })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("inferloop-ota/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            // A stalled download fails after a minute of silence, and resumes on the next try.
            .read_timeout(Duration::from_secs(60));
        if let Some(ca) = &settings.ca_file {
            let pem = std::fs::read(ca).map_err(|e| OtaError::Config {
                path: ca.clone(),
                message: format!("`ca_file` cannot be read: {e}"),
            })?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| OtaError::Config {
                    path: ca.clone(),
                    message: format!("not a PEM certificate bundle: {e}"),
                })?;
            if certs.is_empty() {
                return Err(OtaError::Config {
                    path: ca.clone(),
                    message: "`ca_file` holds no PEM certificate".into(),
                });
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder.build().map_err(|e| OtaError::Config {
            path: "tls".into(),
            message: e.to_string(),
        })?;
        Ok(Self {
            http,
            base: settings.base_url(),
        })
    }

    /// The underlying client (downloads use it: same auth, same TLS roots).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub async fn poll(&self) -> Result<Base, OtaError> {
        let url = self.base.clone();
        self.get_json(&url).await
    }

    pub async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, OtaError> {
        let resp = self
            .http
            .get(url)
            .header("Accept", "application/hal+json, application/json")
            .timeout(JSON_TIMEOUT)
            .send()
            .await
            .map_err(|e| unreachable(url, e))?;
        let body = checked_body("GET", url, resp).await?;
        serde_json::from_slice(&body).map_err(|e| OtaError::Garbage {
            url: url.to_string(),
            message: format!("{e} in {}", preview(&body)),
        })
    }

    pub async fn put_config_data(&self, url: &str, data: &ConfigData) -> Result<(), OtaError> {
        self.send_json("PUT", url, data).await
    }

    /// `POST {base}/deploymentBase/{id}/feedback`.
    pub async fn deployment_feedback(&self, fb: &Feedback) -> Result<(), OtaError> {
        let url = format!("{}/deploymentBase/{}/feedback", self.base, fb.id);
        self.send_json("POST", &url, fb).await
    }

    /// `POST {base}/cancelAction/{id}/feedback`.
    pub async fn cancel_feedback(&self, fb: &Feedback) -> Result<(), OtaError> {
        let url = format!("{}/cancelAction/{}/feedback", self.base, fb.id);
        self.send_json("POST", &url, fb).await
    }

    async fn send_json<T: Serialize>(
        &self,
        method: &'static str,
        url: &str,
        body: &T,
    ) -> Result<(), OtaError> {
        let req = match method {
            "PUT" => self.http.put(url),
            _ => self.http.post(url),
        };
        let resp = req
            .json(body)
            .timeout(JSON_TIMEOUT)
            .send()
            .await
            .map_err(|e| unreachable(url, e))?;
        checked_body(method, url, resp).await.map(|_| ())
    }
}

fn unreachable(url: &str, e: reqwest::Error) -> OtaError {
    OtaError::unreachable(url, &e)
}

async fn checked_body(
    method: &'static str,
    url: &str,
    resp: reqwest::Response,
) -> Result<Vec<u8>, OtaError> {
    let status = resp.status();
    if let Some(len) = resp.content_length() {
        if len as usize > MAX_JSON_BYTES {
            return Err(OtaError::Garbage {
                url: url.to_string(),
                message: format!("a {len}-byte reply"),
            });
        }
    }
    let body = resp.bytes().await.map_err(|e| unreachable(url, e))?;
    if !status.is_success() {
        return Err(OtaError::status(
            method,
            url,
            status.as_u16(),
            preview(&body),
        ));
    }
    Ok(body.to_vec())
}

fn preview(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    if body.len() > 200 {
        format!("{s:?}…")
    } else {
        format!("{s:?}")
    }
}
