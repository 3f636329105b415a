//! Per-tenant quotas: requests and tokens per window, counted in sliding windows that several
//! replicas can share.
//!
//! Pure: time is passed in as milliseconds since an epoch every replica agrees on (the gateway
//! passes Unix time), so the same bucket numbers name the same stretch of time on every replica
//! and can be shared through a store such as Redis.
//!
//! # The algorithm: a bucketed sliding window
//!
//! A [`Window`] of length `W` is a ring of `N` buckets of `W / N` each; a use is counted in the
//! bucket of the moment it happened and leaves the window when that bucket does, `W` after the
//! bucket began. The count is the sum of the live buckets. A limit `L` therefore holds over
//! every stretch of `W` aligned to a bucket start, and over any stretch of `W` the window admits
//! at most `L` plus what the bucket that just left held: the long-run rate is at most
//! `L / (W - W/N)`, i.e. `N / (N - 1)` times the configured one — 1.7% over with the default
//! 60 buckets, inside the 5% the quotas promise. A plain two-bucket approximation (the previous
//! and the current fixed window, the previous one weighted) assumes uses were spread evenly over
//! the previous window; a burst breaks that assumption and the rate drifts by up to the burst,
//! and it cannot say exactly when capacity returns. The ring can: [`Window::retry_after`] walks
//! the buckets from the oldest and answers the moment enough counted use has left.
//!
//! # Sharing between replicas
//!
//! Each bucket keeps three parts: `shared`, the total every replica has written to the store
//! for it (as last read back); `sending`, this replica's deltas on their way to the store; and
//! `unsynced`, this replica's deltas not yet sent. Between two syncs this replica cannot see
//! what the others did, so it assumes each of the `replicas` did as much as it did:
//!
//! `count = Σ shared + replicas × Σ (sending + unsynced) + (replicas − 1) × Σ recent`
//!
//! The last term covers the other replicas' part of this replica's last completed rounds that
//! the store may not hold yet: `recent` is what this replica added in each round taken after
//! the moment every replica is known to have synced ([`Window::set_peers_synced`]; the caller
//! reads each replica's last round time from the store with the totals). A round's deltas are
//! this replica's use since its previous round; the others' use of the same stretch is in the
//! store only once each of them has completed a round after it. Peers that sync on time leave
//! one round to cover; a peer whose rounds run late (a starved or CPU-throttled process) leaves
//! more, up to [`COVERED_ROUNDS`]. Covering one round whatever the peers' lateness, a peer one
//! round late let the replicas admit 9% over the limit, three rounds late 22%
//! (`a_peer_whose_rounds_run_late_does_not_let_the_others_over_admit`). With equal traffic on
//! every replica the estimate is exact or errs on the side of the limit; with unequal traffic it
//! errs on the side of the limit too, by no more than one round's use while the peers are on
//! time.
//!
//! When the store is unreachable the same rule is the fallback: nothing is sent,
//! `unsynced` grows with this replica's own use, and once the last totals read age out each
//! replica enforces its share, `L / replicas`, with `replicas` as last seen. A replica alone
//! (or before its first sync) counts with `replicas = 1`: the whole quota.
//!
//! The sync protocol, driven by the caller: [`Window::take_unsynced`] moves `unsynced` into
//! `sending` and lists, for each bucket that changed, this replica's *own total* for it (what
//! the store acknowledged before plus what is being sent); the store keeps each replica's own
//! total per bucket and moves the bucket's sum by the difference, so writing a total twice
//! counts it once. After the store has taken them and read the live buckets back,
//! [`Window::apply_shared`] sets each bucket's total and clears `sending`; if the round trip
//! failed, [`Window::sync_failed`] moves `sending` back into `unsynced` and the next round sends
//! every live bucket's own total again. A round that timed out after the store applied it is
//! therefore not counted twice (sending deltas, it was: the fleet under-admitted by that round
//! until its buckets left the window), and a store that restarted empty gets each replica's
//! live use back at its first round.
//!
//! # A tenant's quota
//!
//! [`TenantQuota`] holds a request window and a token window. A request is admitted against its
//! token estimate ([`TenantQuota::admit`]), and the estimate is corrected to the tokens the
//! response reported (input plus output) when it completes ([`TenantQuota::settle`]); the
//! correction goes into the bucket the estimate was charged to, so it leaves the window at the
//! same moment.

use std::time::Duration;

/// Buckets in a window unless configured: one-second buckets in a one-minute window.
pub const DEFAULT_BUCKETS: u32 = 60;

/// The window unless configured: one minute, so limits read as "per minute".
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// A quota configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// The window is shorter than its bucket count in milliseconds, or not a whole number of
    /// milliseconds per bucket.
    #[error(
        "a quota window of {window_ms} ms cannot be split into {buckets} buckets of whole milliseconds"
    )]
    BadWindow {
        /// The window in milliseconds.
        window_ms: u64,
        /// The bucket count.
        buckets: u32,
    },
    /// Fewer than two buckets: the window would be a fixed one.
    #[error("a quota window needs at least 2 buckets, got {buckets}")]
    TooFewBuckets {
        /// The bucket count.
        buckets: u32,
    },
}

/// One bucket of a [`Window`].
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The bucket number held (`time / bucket length`); a slot whose epoch is not live is empty.
    epoch: u64,
    /// Every replica's total for this bucket, as last read from the store.
    shared: u64,
    /// This replica's deltas sent, not yet read back.
    sending: i64,
    /// This replica's deltas not yet sent.
    unsynced: i64,
    /// This replica's total for this bucket that the store acknowledged.
    acked: i64,
    /// What this replica's last [`COVERED_ROUNDS`] completed rounds added, newest first, with
    /// when each was taken: the others' counterparts may not have reached the store yet.
    recent: [Sent; COVERED_ROUNDS],
    /// The sum of the positive `recent` deltas taken after the peers last synced: kept by the
    /// sync (which changes both) so that a count reads one number per bucket.
    cover: i64,
}

/// One round's delta for one bucket, and when the round took it (ms, the window's clock).
#[derive(Debug, Clone, Copy, Default)]
struct Sent {
    at_ms: u64,
    delta: i64,
}

/// The most of its own completed rounds a replica covers for the others (see the module
/// documentation): a peer up to one round late does not make the fleet over-admit. More rounds
/// would cover later peers, at the price of holding back a replica whose peers' last rounds are
/// unknown (after a Redis restart) by every round it keeps.
pub const COVERED_ROUNDS: usize = 2;

/// A sliding window of counts in `N` buckets; see the module documentation.
#[derive(Debug, Clone)]
pub struct Window {
    bucket_ms: u64,
    slots: Box<[Slot]>,
    /// Every replica's use up to this moment is in the store (`None`: not known, every recent
    /// round is covered).
    peers_synced_ms: Option<u64>,
    /// A round failed: the next one sends every live bucket's own total, changed or not (the
    /// store may have restarted empty meanwhile).
    resend: bool,
}

impl Window {
    /// A window of `window` split in `buckets` buckets of whole milliseconds.
    pub fn new(window: Duration, buckets: u32) -> Result<Self, QuotaError> {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        if buckets < 2 {
            return Err(QuotaError::TooFewBuckets { buckets });
        }
        if window_ms == 0 || window_ms % u64::from(buckets) != 0 {
            return Err(QuotaError::BadWindow { window_ms, buckets });
        }
        Ok(Window {
            bucket_ms: window_ms / u64::from(buckets),
            slots: vec![Slot::default(); buckets as usize].into_boxed_slice(),
            peers_synced_ms: None,
            resend: false,
        })
    }

    /// The length of one bucket in milliseconds.
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// The window's length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.bucket_ms * self.slots.len() as u64
    }

    /// The bucket number of the instant `now_ms`.
    pub fn epoch(&self, now_ms: u64) -> u64 {
        now_ms / self.bucket_ms
    }

    /// Whether bucket `epoch` is inside the window at `now_ms`.
    fn live(&self, epoch: u64, now_ms: u64) -> bool {
        let current = self.epoch(now_ms);
        epoch <= current && current - epoch < self.slots.len() as u64
    }

    /// The live bucket numbers at `now_ms`, oldest first (fewer near the epoch's start).
    pub fn live_epochs(&self, now_ms: u64) -> std::ops::RangeInclusive<u64> {
        let current = self.epoch(now_ms);
        let first = current.saturating_sub(self.slots.len() as u64 - 1);
        first..=current
    }

    fn slot_index(&self, epoch: u64) -> usize {
        (epoch % self.slots.len() as u64) as usize
    }

    /// The slot for `epoch`, emptied first if it held an older bucket.
    fn slot_mut(&mut self, epoch: u64) -> &mut Slot {
        let i = self.slot_index(epoch);
        let slot = &mut self.slots[i];
        if slot.epoch != epoch {
            *slot = Slot {
                epoch,
                ..Slot::default()
            };
        }
        slot
    }

    /// One live slot's contribution with `replicas` replicas, or 0 for a stale slot.
    fn contribution(&self, slot: &Slot, now_ms: u64, replicas: u32) -> u64 {
        if !self.live(slot.epoch, now_ms) {
            return 0;
        }
        let replicas = i64::from(replicas.max(1));
        let own = slot.sending.saturating_add(slot.unsynced);
        let scaled = own.saturating_mul(replicas);
        let others = slot.cover.saturating_mul(replicas - 1);
        let total = i128::from(slot.shared) + i128::from(scaled) + i128::from(others);
        u64::try_from(total.max(0)).unwrap_or(u64::MAX)
    }

    /// The count at `now_ms`: the shared totals plus this replica's unsent deltas, scaled by
    /// `replicas` (see the module documentation).
    pub fn count(&self, now_ms: u64, replicas: u32) -> u64 {
        self.slots
            .iter()
            .map(|s| self.contribution(s, now_ms, replicas))
            .fold(0u64, u64::saturating_add)
    }

    /// Counts `n` uses at `now_ms`; returns the bucket charged, for a later [`Window::adjust`].
    pub fn add(&mut self, now_ms: u64, n: u64) -> u64 {
        let epoch = self.epoch(now_ms);
        let slot = self.slot_mut(epoch);
        slot.unsynced = slot
            .unsynced
            .saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
        epoch
    }

    /// Adds `delta` (negative to give back) to bucket `epoch`, if it is still in the window at
    /// `now_ms`; a bucket that has left needs no correction.
    pub fn adjust(&mut self, now_ms: u64, epoch: u64, delta: i64) {
        if delta != 0 && self.live(epoch, now_ms) {
            let slot = self.slot_mut(epoch);
            slot.unsynced = slot.unsynced.saturating_add(delta);
        }
    }

    /// How long from `now_ms` until `cost` more uses fit under `limit`, with `replicas`
    /// replicas: zero when they fit now; else the moment the oldest buckets holding enough
    /// counted use leave the window. Never longer than the window.
    pub fn retry_after(&self, now_ms: u64, replicas: u32, cost: u64, limit: u64) -> Duration {
        let count = self.count(now_ms, replicas);
        let Some(excess) = count.saturating_add(cost).checked_sub(limit) else {
            return Duration::ZERO;
        };
        if excess == 0 {
            return Duration::ZERO;
        }
        let mut freed = 0u64;
        for epoch in self.live_epochs(now_ms) {
            let slot = &self.slots[self.slot_index(epoch)];
            if slot.epoch != epoch {
                continue;
            }
            freed = freed.saturating_add(self.contribution(slot, now_ms, replicas));
            if freed >= excess {
                let leaves = (epoch + self.slots.len() as u64) * self.bucket_ms;
                return Duration::from_millis(leaves.saturating_sub(now_ms));
            }
        }
        // Only when `cost` alone exceeds `limit`: the whole window must pass.
        Duration::from_millis(self.window_ms())
    }

    /// Moves this replica's unsent deltas of the live buckets into `sending` and appends to
    /// `out`, for each bucket that changed, `(bucket, own total)`: this replica's whole use of
    /// the bucket, which the store records per replica (writing it again changes nothing).
    /// After a failed round every live bucket this replica used is listed.
    pub fn take_unsynced(&mut self, now_ms: u64, out: &mut Vec<(u64, i64)>) {
        let resend = std::mem::take(&mut self.resend);
        for epoch in self.live_epochs(now_ms) {
            let i = self.slot_index(epoch);
            let slot = &mut self.slots[i];
            if slot.epoch != epoch {
                continue;
            }
            let changed = slot.unsynced != 0;
            slot.sending = slot.sending.saturating_add(slot.unsynced);
            slot.unsynced = 0;
            let own = slot.acked.saturating_add(slot.sending);
            if changed || (resend && own != 0) {
                out.push((epoch, own));
            }
        }
    }

    /// Every replica has completed a round at or after `ms` (the oldest last-round time the
    /// store holds among the replicas counted): their use up to `ms` is in the totals read with
    /// it, so this replica's rounds taken by then need no cover. `None` when some replica's
    /// last round is unknown: every recent round is covered.
    pub fn set_peers_synced(&mut self, ms: Option<u64>) {
        if self.peers_synced_ms != ms {
            self.peers_synced_ms = ms;
            for slot in self.slots.iter_mut() {
                slot.cover = cover(&slot.recent, ms);
            }
        }
    }

    /// The store's total for bucket `epoch`, read after this replica's own totals were written
    /// in a round taken at `now_ms`: replaces the bucket's shared total and clears what was being
    /// sent.
    /// A bucket whose slot a later bucket already holds (the round trip outlasted the window)
    /// is ignored.
    pub fn apply_shared(&mut self, now_ms: u64, epoch: u64, total: u64) {
        let held = self.slots[self.slot_index(epoch)].epoch;
        if self.live(epoch, now_ms) && held <= epoch {
            let peers_synced_ms = self.peers_synced_ms;
            let slot = self.slot_mut(epoch);
            slot.shared = total;
            slot.recent.rotate_right(1);
            slot.recent[0] = Sent {
                at_ms: now_ms,
                delta: slot.sending,
            };
            slot.cover = cover(&slot.recent, peers_synced_ms);
            slot.acked = slot.acked.saturating_add(slot.sending);
            slot.sending = 0;
        }
    }

    /// The round trip to the store failed (whether or not the store applied it): the next
    /// round sends every live bucket's own total again.
    pub fn sync_failed(&mut self) {
        for slot in self.slots.iter_mut() {
            slot.unsynced = slot.unsynced.saturating_add(slot.sending);
            slot.sending = 0;
        }
        self.resend = true;
    }
}

/// What a bucket's `recent` rounds taken after `peers_synced_ms` added (see [`Slot::cover`]).
fn cover(recent: &[Sent], peers_synced_ms: Option<u64>) -> i64 {
    recent
        .iter()
        .filter(|sent| peers_synced_ms.is_none_or(|ms| sent.at_ms > ms))
        .fold(0i64, |sum, sent| sum.saturating_add(sent.delta.max(0)))
}

/// A tenant's limits per window (`None`: no limit of that kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Requests per window.
    pub requests: Option<u64>,
    /// Tokens (input plus output) per window.
    pub tokens: Option<u64>,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    /// The request limit.
    Requests,
    /// The token limit.
    Tokens,
}

impl QuotaKind {
    /// A stable label (`requests` or `tokens`) for metrics, keys and reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Requests => "requests",
            QuotaKind::Tokens => "tokens",
        }
    }
}

/// A request refused by a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    /// The limit reached.
    pub kind: QuotaKind,
    /// Its value per window.
    pub limit: u64,
    /// When enough counted use will have left the window for this request to fit.
    pub retry_after: Duration,
}

/// What an admitted request was charged: kept to correct the token estimate on completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The bucket charged.
    pub epoch: u64,
    /// The tokens charged (the estimate, capped at the token limit).
    pub tokens: u64,
}

/// One tenant's limits and windows.
#[derive(Debug, Clone)]
pub struct TenantQuota {
    limits: Limits,
    requests: Window,
    tokens: Window,
}

impl TenantQuota {
    /// A quota with `limits` over `window` split in `buckets`.
    pub fn new(limits: Limits, window: Duration, buckets: u32) -> Result<Self, QuotaError> {
        Ok(TenantQuota {
            limits,
            requests: Window::new(window, buckets)?,
            tokens: Window::new(window, buckets)?,
        })
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The request window.
    pub fn requests(&self) -> &Window {
        &self.requests
    }

    /// The token window.
    pub fn tokens(&self) -> &Window {
        &self.tokens
    }

    /// Both windows, for the sync protocol.
    pub fn windows_mut(&mut self) -> (&mut Window, &mut Window) {
        (&mut self.requests, &mut self.tokens)
    }

    /// Admits one request estimated at `estimated_tokens` at `now_ms`, or says which limit
    /// refuses it and when to retry. An estimate above the token limit is charged as the limit,
    /// so a large request is admitted once the window is empty instead of never. On refusal
    /// nothing is counted.
    pub fn admit(
        &mut self,
        now_ms: u64,
        replicas: u32,
        estimated_tokens: u64,
    ) -> Result<Charge, Exceeded> {
        if let Some(limit) = self.limits.requests {
            let wait = self.requests.retry_after(now_ms, replicas, 1, limit);
            if !wait.is_zero() {
                return Err(Exceeded {
                    kind: QuotaKind::Requests,
                    limit,
                    retry_after: wait,
                });
            }
        }
        let tokens = match self.limits.tokens {
            Some(limit) => {
                let cost = estimated_tokens.min(limit);
                let wait = self.tokens.retry_after(now_ms, replicas, cost, limit);
                if !wait.is_zero() {
                    return Err(Exceeded {
                        kind: QuotaKind::Tokens,
                        limit,
                        retry_after: wait,
                    });
                }
                cost
            }
            None => estimated_tokens,
        };
        let epoch = self.requests.add(now_ms, 1);
        self.tokens.add(now_ms, tokens);
        Ok(Charge { epoch, tokens })
    }

    /// Gives `charge` back: the request was refused further on (or never answered), so it
    /// counts neither as a request nor with its tokens.
    pub fn refund(&mut self, now_ms: u64, charge: Charge) {
        self.requests.adjust(now_ms, charge.epoch, -1);
        let tokens = i64::try_from(charge.tokens).unwrap_or(i64::MAX);
        self.tokens.adjust(now_ms, charge.epoch, -tokens);
    }

    /// Corrects `charge` to the `actual_tokens` the response reported (input plus output).
    pub fn settle(&mut self, now_ms: u64, charge: Charge, actual_tokens: u64) {
        let delta = i128::from(actual_tokens) - i128::from(charge.tokens);
        let delta = i64::try_from(delta).unwrap_or(if delta < 0 { i64::MIN } else { i64::MAX });
        self.tokens.adjust(now_ms, charge.epoch, delta);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
