//! Scheduler bookkeeping: which slots are busy and who waits, as a plain synchronous struct.
//!
//! The decode thread owns one `State`; keeping it free of llama.cpp and channels lets the
//! admission rules be tested on their own.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Anything that can wait in the queue; `is_gone` is true once its client has left.
pub trait Waiter {
    fn is_gone(&self) -> bool;
    /// KV cells the job may fill: prompt + max_tokens.
    fn kv_cells(&self) -> u64;
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Every slot is busy and the queue holds `capacity` waiters already.
    QueueFull { capacity: usize },
}

struct Queued<J> {
    job: J,
    since: Instant,
    /// Jobs that start together from here: the group's size on its first job (1 for a job
    /// alone), 0 on the rest of a group, which follow it in the queue.
    group: usize,
}

/// Slots and the FIFO queue in front of them, plus the KV cells each running job reserved.
///
/// A slot is a backend sequence. There may be more sequences than may run at once (prefix
/// slots): idle ones keep prompt prefixes, and a job may start in any idle one.
pub struct State<J> {
    busy: Vec<bool>,
    /// Cells reserved per slot (0 when idle).
    reserved: Vec<u64>,
    kv_capacity: u64,
    /// Slots that may be busy at once.
    slots: usize,
    /// Admission cap at or below `slots`, lowered e.g. when the board runs hot.
    max_active: usize,
    queue: VecDeque<Queued<J>>,
    queue_capacity: usize,
    queue_timeout: Duration,
    /// Waiters dropped because their client left, since the last `take_departed`.
    departed: u64,
}

impl<J: Waiter> State<J> {
    pub fn new(
        slots: usize,
        queue_capacity: usize,
        queue_timeout: Duration,
        kv_capacity: u64,
    ) -> Self {
        Self {
            busy: vec![false; slots],
            reserved: vec![0; slots],
            kv_capacity,
            slots,
            max_active: slots,
            queue: VecDeque::new(),
            queue_capacity,
            queue_timeout,
            departed: 0,
        }
    }

    /// `n` more sequences, for prefix reuse: no more jobs run at once than before.
    pub fn with_prefix_slots(mut self, n: usize) -> Self {
        self.busy.resize(self.busy.len() + n, false);
        self.reserved.resize(self.busy.len(), 0);
        self
    }

    /// Slots that may be busy at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn active(&self) -> usize {
        self.busy.iter().filter(|b| **b).count()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn queue_capacity(&self) -> usize {
        self.queue_capacity
    }

    /// KV cells reserved by running jobs.
    pub fn kv_reserved(&self) -> u64 {
        self.reserved.iter().sum()
    }

    /// Limits how many slots may be busy at once (clamped to 1..=slots).
    pub fn set_max_active(&mut self, n: usize) {
        self.max_active = n.clamp(1, self.slots);
    }

    /// Accepts a job unless, at this moment, every slot is taken and the queue is full.
    ///
    /// Jobs offered together (a burst on an idle server) reach the decode thread before it
    /// admits any of them, so they all sit in the queue for a moment: the queue is judged by
    /// what would still wait after every startable job started, not by its raw length.
    /// Waiters whose client left are dropped first, so they never cost a live client a 429.
    pub fn offer(&mut self, job: J, now: Instant) -> Result<(), (Rejected, J)> {
        self.offer_group(vec![job], now)
            .map_err(|(r, mut jobs)| (r, jobs.remove(0)))
    }

    /// Accepts jobs that must start together (a request's `n` choices), or none of them:
    /// they count as that many waiters, and [`admit`](Self::admit) starts the first only
    /// when there are slots and cells for all, the rest right after it.
    pub fn offer_group(&mut self, jobs: Vec<J>, now: Instant) -> Result<(), (Rejected, Vec<J>)> {
        self.drop_gone();
        let size = jobs.len();
        let would_wait = (self.queue.len() + size).saturating_sub(self.startable(&jobs));
        if size == 0 || would_wait > self.queue_capacity {
            return Err((
                Rejected::QueueFull {
                    capacity: self.queue_capacity,
                },
                jobs,
            ));
        }
        for (group, job) in group_marks(size).zip(jobs) {
            self.queue.push_back(Queued {
                job,
                since: now,
                group,
            });
        }
        Ok(())
    }

    /// How many queued jobs (then `next`, one group), from the front, `admit` would start
    /// now: free slots under the cap, KV cells in FIFO order (a head short of cells blocks
    /// the rest), a group whole or not at all.
    fn startable(&self, next: &[J]) -> usize {
        let mut slots = self.max_active.saturating_sub(self.active());
        let mut cells = self.kv_reserved();
        let mut n = 0;
        let queued = self.queue.iter().map(|q| (q.group, &q.job));
        let next = group_marks(next.len()).zip(next);
        let jobs: Vec<(usize, &J)> = queued.chain(next).collect();
        let mut i = 0;
        while i < jobs.len() {
            let size = jobs[i].0.max(1);
            let members = &jobs[i..(i + size).min(jobs.len())];
            let need: u64 = members.iter().map(|(_, j)| j.kv_cells()).sum();
            if slots < members.len() || cells + need > self.kv_capacity {
                break;
            }
            slots -= members.len();
            cells += need;
            n += members.len();
            i += members.len();
        }
        n
    }

    /// Removes waiters that waited past the queue timeout, oldest first.
    pub fn expire(&mut self, now: Instant) -> Vec<J> {
        let timeout = self.queue_timeout;
        let (expired, kept): (Vec<_>, Vec<_>) = self
            .queue
            .drain(..)
            .partition(|q| now.saturating_duration_since(q.since) >= timeout);
        self.queue = kept.into();
        expired.into_iter().map(|q| q.job).collect()
    }

    /// Removes waiters whose client has left, so they neither hold queue room nor a slot.
    pub fn drop_gone(&mut self) -> usize {
        let before = self.queue.len();
        self.queue.retain(|q| !q.job.is_gone());
        let dropped = before - self.queue.len();
        self.departed += dropped as u64;
        dropped
    }

    /// Waiters dropped because their client left since the last call: they are
    /// cancellations, counted like those of running requests.
    pub fn take_departed(&mut self) -> u64 {
        std::mem::take(&mut self.departed)
    }

    /// Moves the oldest live waiter into a free slot if its KV cells are free too. Waiters
    /// that left are discarded on the way; a waiter short of cells blocks those behind it,
    /// so big requests are not starved by small ones.
    pub fn admit(&mut self, now: Instant) -> Option<Admitted<J>> {
        self.admit_to(now, |_, free| free[0])
    }

    /// [`admit`](Self::admit), with `pick` choosing among the free slots (never empty) the
    /// one the job goes to, e.g. the slot already holding the start of its prompt.
    pub fn admit_to(
        &mut self,
        now: Instant,
        pick: impl FnOnce(&J, &[usize]) -> usize,
    ) -> Option<Admitted<J>> {
        self.free_slot()?;
        while let Some(front) = self.queue.front() {
            if front.job.is_gone() {
                self.queue.pop_front();
                self.departed += 1;
                continue;
            }
            // A group's first job (a job alone is a group of one) starts only with room for
            // the whole group; the rest (`group` 0) then follow it at once, into the room it
            // was judged by.
            if front.group > 0 {
                let members = self.queue.iter().take(front.group);
                let need: u64 = members.map(|q| q.job.kv_cells()).sum();
                let free = self.max_active.saturating_sub(self.active());
                if free < front.group || !self.kv_fits(need) {
                    return None;
                }
            }
            let q = self.queue.pop_front()?;
            let free: Vec<usize> = (0..self.busy.len()).filter(|&i| !self.busy[i]).collect();
            let picked = pick(&q.job, &free);
            let slot = if free.contains(&picked) {
                picked
            } else {
                free[0]
            };
            self.busy[slot] = true;
            self.reserved[slot] = q.job.kv_cells();
            return Some(Admitted {
                slot,
                job: q.job,
                waited: now.saturating_duration_since(q.since),
                follows: q.group == 0,
            });
        }
        None
    }

    /// Gives a slot back; the next `admit` may hand it out again.
    pub fn release(&mut self, slot: usize) {
        if let Some(b) = self.busy.get_mut(slot) {
            *b = false;
        }
        if let Some(r) = self.reserved.get_mut(slot) {
            *r = 0;
        }
    }

    /// Empties the queue (shutdown), returning the waiters so they can be told.
    pub fn drain_queue(&mut self) -> Vec<J> {
        self.queue.drain(..).map(|q| q.job).collect()
    }

    fn kv_fits(&self, cells: u64) -> bool {
        self.kv_reserved() + cells <= self.kv_capacity
    }

    fn free_slot(&self) -> Option<usize> {
        if self.active() >= self.max_active {
            return None;
        }
        self.busy.iter().position(|b| !*b)
    }
}

/// [`Queued::group`] for each job of a group of `size`: the size on the first, 0 after.
fn group_marks(size: usize) -> impl Iterator<Item = usize> {
    std::iter::once(size).chain(std::iter::repeat(0)).take(size)
}

/// A job that got a slot, and how long it waited for it.
pub struct Admitted<J> {
    pub slot: usize,
    pub job: J,
    pub waited: Duration,
    /// A later job of a group, started right after the job before it.
    pub follows: bool,
}
