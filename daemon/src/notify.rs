//! systemd's notify protocol, spoken directly over `$NOTIFY_SOCKET` (a datagram per state
//! change) so the daemon needs no libsystemd: `READY=1` once the boot gates passed and the
//! model serves, `WATCHDOG=1` while the decode thread is alive, `STOPPING=1` on shutdown.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where to send notifications; absent when not started by systemd with `Type=notify`.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: std::os::unix::net::SocketAddr,
    /// Half of `WatchdogSec`, when the unit asks for a watchdog.
    pub watchdog_every: Option<Duration>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` and `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be us).
    pub fn from_env() -> Option<Self> {
        let path = std::env::var("NOTIFY_SOCKET").ok()?;
        let target = match path.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).ok()?
            }
            None => std::os::unix::net::SocketAddr::from_pathname(&path).ok()?,
        };
        let socket = UnixDatagram::unbound().ok()?;
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|pid| pid == std::process::id());
        let watchdog_every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0 && for_us)
            .map(|u| Duration::from_micros(u / 2));
        Some(Self {
            socket,
            target,
            watchdog_every,
        })
    }

    /// Sends one state string; failures are logged, never fatal.
    pub fn notify(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.target) {
            tracing::warn!(state, error = %e, "sd_notify failed");
        }
    }
}
