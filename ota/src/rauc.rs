//! RAUC's `de.pengutronix.rauc.Installer` on the system bus, behind [`Installer`] so the
//! agent's policy can be driven by a fake.
//!
//! The bus is `DBUS_SYSTEM_BUS_ADDRESS` when set (the tests' private bus), else the
//! system bus. Each operation opens its own connection: a restarted RAUC service or bus
//! costs nothing more than the next call.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use zbus::proxy::CacheProperties;
use zbus::zvariant::{OwnedValue, Value};

use crate::OtaError;

/// RAUC's `Progress` property: percentage and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallProgress {
    pub percentage: i32,
    pub message: String,
}

/// One slot as `GetSlotStatus` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub bootname: Option<String>,
    /// `booted`, `active` or `inactive`.
    pub state: Option<String>,
    /// The bootloader's `good` / `bad`.
    pub boot_status: Option<String>,
}

/// Which slot the box runs and which it boots next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slots {
    /// The booted slot's bootname (`BootSlot`).
    pub booted: String,
    /// The primary slot's name (`GetPrimary`), when the bootloader says.
    pub primary: Option<String>,
    pub slots: Vec<Slot>,
}

impl Slots {
    pub fn by_name(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.name == name)
    }

    pub fn by_bootname(&self, bootname: &str) -> Option<&Slot> {
        self.slots
            .iter()
            .find(|s| s.bootname.as_deref() == Some(bootname))
    }
}

/// What the agent needs from RAUC.
pub trait Installer {
    /// `Operation`: `idle` or `installing`.
    fn operation(&self) -> impl Future<Output = Result<String, OtaError>> + Send;
    /// Installs `bundle` and returns once RAUC signalled `Completed`; progress on the way.
    fn install(
        &self,
        bundle: &Path,
        progress: mpsc::Sender<InstallProgress>,
    ) -> impl Future<Output = Result<(), OtaError>> + Send;
    fn slots(&self) -> impl Future<Output = Result<Slots, OtaError>> + Send;
    /// `BootSlot`: the booted slot's bootname. Cheap, unlike [`Installer::slots`], which
    /// runs the bootloader backend for every slot.
    fn booted(&self) -> impl Future<Output = Result<String, OtaError>> + Send;
    /// `Compatible`: what RAUC checks a bundle's compatible against.
    fn compatible(&self) -> impl Future<Output = Result<String, OtaError>> + Send;
}

#[zbus::proxy(
    interface = "de.pengutronix.rauc.Installer",
    default_service = "de.pengutronix.rauc",
    default_path = "/"
)]
trait RaucInstaller {
    fn install_bundle(&self, source: &str, args: HashMap<&str, Value<'_>>) -> zbus::Result<()>;
    fn get_slot_status(&self) -> zbus::Result<Vec<(String, HashMap<String, OwnedValue>)>>;
    fn get_primary(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn completed(&self, result: i32) -> zbus::Result<()>;
    #[zbus(property)]
    fn operation(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn last_error(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn progress(&self) -> zbus::Result<(i32, String, i32)>;
    #[zbus(property)]
    fn boot_slot(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn compatible(&self) -> zbus::Result<String>;
}

/// The real RAUC service over D-Bus.
#[derive(Debug, Clone, Default)]
pub struct DbusInstaller;

fn rauc_err(what: &str) -> impl FnOnce(zbus::Error) -> OtaError + '_ {
    move |e| OtaError::Rauc {
        message: format!("{what}: {e}"),
    }
}

impl DbusInstaller {
    async fn proxy(&self) -> Result<RaucInstallerProxy<'static>, OtaError> {
        let conn = zbus::Connection::system()
            .await
            .map_err(rauc_err("connecting to the system bus"))?;
        // Uncached: a cached property could be stale right after Completed.
        RaucInstallerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(rauc_err("creating the Installer proxy"))
    }
}

fn str_of(v: &OwnedValue) -> Option<String> {
    match &**v {
        Value::Str(s) => Some(s.to_string()),
        _ => None,
    }
}

impl Installer for DbusInstaller {
    async fn operation(&self) -> Result<String, OtaError> {
        self.proxy()
            .await?
            .operation()
            .await
            .map_err(rauc_err("reading Operation"))
    }

    async fn install(
        &self,
        bundle: &Path,
        progress: mpsc::Sender<InstallProgress>,
    ) -> Result<(), OtaError> {
        let proxy = self.proxy().await?;
        // Subscribe before the call: a small bundle can complete before a late subscriber.
        let mut completed = proxy
            .receive_completed()
            .await
            .map_err(rauc_err("subscribing to Completed"))?;
        let source = bundle.to_string_lossy();
        proxy
            .install_bundle(&source, HashMap::new())
            .await
            .map_err(|e| match e {
                // RAUC answers a busy or unreadable request right away.
                zbus::Error::MethodError(name, msg, _) => OtaError::InstallFailed {
                    code: -1,
                    last_error: format!("{name}: {}", msg.unwrap_or_default()),
                },
                e => rauc_err("calling InstallBundle")(e),
            })?;
        let mut last: Option<InstallProgress> = None;
        let mut failures = 0u32;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                sig = completed.next() => {
                    let sig = sig.ok_or_else(|| OtaError::Rauc {
                        message: "the Completed signal stream ended (RAUC service disappeared?)".into(),
                    })?;
                    let code = sig.args().map_err(rauc_err("reading Completed"))?.result;
                    if code == 0 {
                        return Ok(());
                    }
                    let last_error = proxy.last_error().await.unwrap_or_else(|e| format!("(LastError unreadable: {e})"));
                    return Err(OtaError::InstallFailed { code, last_error });
                }
                _ = tick.tick() => {
                    match proxy.progress().await {
                        Ok((percentage, message, _depth)) => {
                            failures = 0;
                            let p = InstallProgress { percentage, message };
                            if last.as_ref() != Some(&p) {
                                last = Some(p.clone());
                                // A slow reader only misses intermediate steps.
                                let _ = progress.try_send(p);
                            }
                        }
                        Err(e) => {
                            failures += 1;
                            if failures >= 8 {
                                return Err(OtaError::Rauc {
                                    message: format!("RAUC service disappeared during the install: {e}"),
                                });
                            }
                        }
                    }
                }
            }
        }
    }

    async fn booted(&self) -> Result<String, OtaError> {
        self.proxy()
            .await?
            .boot_slot()
            .await
            .map_err(rauc_err("reading BootSlot"))
    }

    async fn compatible(&self) -> Result<String, OtaError> {
        self.proxy()
            .await?
            .compatible()
            .await
            .map_err(rauc_err("reading Compatible"))
    }

    async fn slots(&self) -> Result<Slots, OtaError> {
        let proxy = self.proxy().await?;
        let booted = proxy
            .boot_slot()
            .await
            .map_err(rauc_err("reading BootSlot"))?;
        // Not every bootloader backend can say; the status still works without it.
        let primary = proxy.get_primary().await.ok();
        let raw = proxy
            .get_slot_status()
            .await
            .map_err(rauc_err("calling GetSlotStatus"))?;
        let slots = raw
            .into_iter()
            .map(|(name, d)| Slot {
                name,
                bootname: d.get("bootname").and_then(str_of),
                state: d.get("state").and_then(str_of),
                boot_status: d.get("boot-status").and_then(str_of),
            })
            .collect();
        Ok(Slots {
            booted,
            primary,
            slots,
        })
    }
}
