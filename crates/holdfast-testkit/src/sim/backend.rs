//! The client's side of a simulated store: the [`Backend`] calls, each one
//! request over the client's [`Link`], applied atomically when it arrives.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::admission::Shrink;
use holdfast::backend::wait::{Attempt, LocalWakeups, until_granted};
use holdfast::backend::{AcquireRequest, Backend, Grant, LeaseMode, LockStatus, RenewRequest};
use holdfast::{Capabilities, Error, FenceDurability, LockKey, OwnerToken, Result};
use tokio::sync::oneshot;

use super::link::Link;
use super::state::{Acquired, MAX_FENCE_FLOOR, StoreState};
use super::{Data, StoreInner};
use crate::history::Event;

/// A client's connection to a [`SimStore`](super::SimStore).
pub struct SimBackend {
    store: Arc<StoreInner>,
    link: Link,
    waiters: Arc<LocalWakeups>,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend").field("store", &self.store).finish_non_exhaustive()
    }
}

impl SimBackend {
    pub(crate) fn new(store: Arc<StoreInner>, link: Link) -> Self {
        SimBackend { store, link, waiters: Arc::default() }
    }

    pub(crate) fn waiters(&self) -> std::sync::Weak<LocalWakeups> {
        Arc::downgrade(&self.waiters)
    }

    /// Sends one request: `op` runs on the store's data when (if) the
    /// request arrives, and its result comes back unless the reply is lost.
    /// A request sent is not recalled when this future is dropped.
    async fn call<T, F>(&self, what: &'static str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&StoreInner, &mut Data, Duration) -> Result<T> + Send + 'static,
    {
        let plan = self.link.plan();
        let (tx, rx) = oneshot::channel::<Result<T>>();
        if let Some(arrives) = plan.arrives {
            let (store, link) = (self.store.clone(), self.link.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(arrives).await;
                if let Some(place) = plan.place {
                    link.turn(place).await;
                }
                let out = {
                    let mut data = store.data();
                    if data.up {
                        let now = store.clock();
                        op(&store, &mut data, now)
                    } else {
                        Err(Error::backend("sim", true, format!("{what}: connection refused (store restarting)")))
                    }
                };
                if let Some(place) = plan.place {
                    link.applied(place);
                }
                let Some(back) = plan.reply_after else { return };
                tokio::time::sleep(back).await;
                if link.carries_back() {
                    let _ = tx.send(out);
                }
            });
        }
        let timeout = self.store.config.op_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(out)) => out,
            // The reply is lost: the client only learns it at its timeout.
            Ok(Err(_)) => {
                tokio::time::sleep_until(deadline).await;
                Err(Error::backend("sim", true, format!("{what}: no reply within {timeout:?}")))
            }
            Err(_) => Err(Error::backend("sim", true, format!("{what}: no reply within {timeout:?}"))),
        }
    }

    /// One acquire attempt; a waiting one (`reserve`) may leave a reservation.
    async fn attempt(&self, req: &AcquireRequest, reserve: bool) -> Result<Attempt> {
        if req.fence_floor > MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{} is above 2^62, the highest floor the sim takes", req.fence_floor),
            ));
        }
        let started = tokio::time::Instant::now().into_std();
        let req2 = req.clone();
        let acquired = self
            .call("acquire", move |store, data, now| {
                let out = data.state.acquire(&req2, now, reserve);
                let id = store.grant_id(req2.token);
                let expires = now + req2.ttl;
                match &out {
                    Acquired::Granted(fence) => store.record(|r| Event::StoreGranted {
                        id,
                        key: req2.key.to_string(),
                        fence: *fence,
                        at: r.now(),
                        expires: store.history_time(r, expires),
                    }),
                    Acquired::Extended(_) => store.record(|r| Event::StoreExtended {
                        id,
                        at: r.now(),
                        expires: store.history_time(r, expires),
                    }),
                    _ => {}
                }
                Ok(out)
            })
            .await?;
        let ttl = req.ttl;
        match acquired {
            Acquired::Granted(fence) | Acquired::Extended(fence) => {
                Ok(Attempt::Granted(Grant::new(fence, started, ttl)))
            }
            Acquired::Busy(expires_in) => Ok(Attempt::Busy { expires_in }),
            Acquired::Conflict(reason) => Err(Error::Conflict { key: req.key.to_string(), reason }),
        }
    }
}

fn state(data: &mut Data) -> &mut StoreState {
    &mut data.state
}

#[async_trait]
impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.fair = true;
        caps.store_notification = true;
        caps.counts_waiters = true;
        caps.fence_durability = FenceDurability::Durable;
        caps.renew_slice = Some(self.store.config.renew_slice);
        caps.shared_leases = true;
        caps.fence_floor = true;
        caps.records = true;
        caps.shrink = true;
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        Ok(match self.attempt(req, false).await? {
            Attempt::Granted(g) => Some(g),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let waiters = self.waiters.subscribe(req.key.as_str());
        until_granted(&waiters, req, self.store.config.poll, || self.attempt(req, true)).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let key = key.clone();
        self.call("release", move |store, data, now| {
            let held = state(data).release(key.as_str(), token.to_bytes(), now);
            if held {
                store.record(|r| Event::StoreReleased { id: store.grant_id(token), at: r.now() });
            }
            store.notify(&mut data.subscribers, key.as_str());
            Ok(held)
        })
        .await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let leases = leases.to_vec();
        self.call("renew", move |store, data, now| {
            let held = state(data).renew(&leases, now);
            for (l, _) in leases.iter().zip(&held).filter(|(_, h)| **h) {
                let expires = now + l.ttl;
                store.record(|r| Event::StoreExtended {
                    id: store.grant_id(l.token),
                    at: r.now(),
                    expires: store.history_time(r, expires),
                });
            }
            Ok(held)
        })
        .await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let key = key.clone();
        self.call("status", move |_, data, now| Ok(state(data).status(key.as_str(), now))).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let key = key.clone();
        self.call("resize", move |store, data, now| {
            let held = state(data).resize(key.as_str(), limit, now);
            store.notify(&mut data.subscribers, key.as_str());
            Ok(held)
        })
        .await
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        // Nothing for the history: the grant and its fence stay.
        let key = key.clone();
        self.call("shrink", move |store, data, now| {
            let outcome = state(data).shrink(key.as_str(), token.to_bytes(), to, now);
            if outcome == Shrink::Shrunk {
                store.notify(&mut data.subscribers, key.as_str());
            }
            outcome.answer()
        })
        .await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let (key, label) = (key.clone(), label.to_owned());
        self.call("relabel", move |_, data, now| Ok(state(data).relabel(key.as_str(), token.to_bytes(), &label, now)))
            .await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        if floor > MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{floor} is above 2^62, the highest floor the sim takes"),
            ));
        }
        // Nothing for the history: a raise grants, extends and releases nothing.
        let key = key.clone();
        self.call("raise_fence", move |_, data, now| {
            Ok(state(data).raise_fence(key.as_str(), token.to_bytes(), floor, now))
        })
        .await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        let key = key.clone();
        self.call("read_record", move |_, data, _| Ok(state(data).read_record(key.as_str()))).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        // Nothing for the history: a record grants, extends and releases nothing.
        let key = key.clone();
        self.call("write_record", move |_, data, now| {
            Ok(state(data).write_record(key.as_str(), token.to_bytes(), value, now))
        })
        .await
    }
}
