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
}

/// Slots and the FIFO queue in front of them, plus the KV cells each running job reserved.
pub struct State<J> {
    busy: Vec<bool>,
    /// Cells reserved per slot (0 when idle).
    reserved: Vec<u64>,
    kv_capacity: u64,
    /// Admission cap below `busy.len()`, lowered e.g. when the board runs hot.
    max_active: usize,
    queue: VecDeque<Queued<J>>,
    queue_capacity: usize,
    queue_timeout: Duration,
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
            max_active: slots,
            queue: VecDeque::new(),
            queue_capacity,
            queue_timeout,
        }
    }

    pub fn slots(&self) -> usize {
        self.busy.len()
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
        self.max_active = n.clamp(1, self.busy.len());
    }

    /// Accepts a job if it can start now or the queue has room. Waiters whose client left
    /// are dropped first, so they never cost a live client a 429.
    pub fn offer(&mut self, job: J, now: Instant) -> Result<(), (Rejected, J)> {
        self.drop_gone();
        let can_start_now =
            self.queue.is_empty() && self.free_slot().is_some() && self.kv_fits(job.kv_cells());
        if !can_start_now && self.queue.len() >= self.queue_capacity {
            return Err((
                Rejected::QueueFull {
                    capacity: self.queue_capacity,
                },
                job,
            ));
        }
        self.queue.push_back(Queued { job, since: now });
        Ok(())
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
        before - self.queue.len()
    }

    /// Moves the oldest live waiter into a free slot if its KV cells are free too. Waiters
    /// that left are discarded on the way; a waiter short of cells blocks those behind it,
    /// so big requests are not starved by small ones.
    pub fn admit(&mut self, now: Instant) -> Option<Admitted<J>> {
        let slot = self.free_slot()?;
        while let Some(front) = self.queue.front() {
            if front.job.is_gone() {
                self.queue.pop_front();
                continue;
            }
            if !self.kv_fits(front.job.kv_cells()) {
                return None;
            }
            let q = self.queue.pop_front()?;
            self.busy[slot] = true;
            self.reserved[slot] = q.job.kv_cells();
            return Some(Admitted {
                slot,
                job: q.job,
                waited: now.saturating_duration_since(q.since),
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

/// A job that got a slot, and how long it waited for it.
pub struct Admitted<J> {
    pub slot: usize,
    pub job: J,
    pub waited: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Clone)]
    struct Job {
        id: u32,
        cells: u64,
        gone: Rc<Cell<bool>>,
    }

    impl Job {
        fn new(id: u32) -> Self {
            Self::sized(id, 10)
        }
        fn sized(id: u32, cells: u64) -> Self {
            Self {
                id,
                cells,
                gone: Rc::new(Cell::new(false)),
            }
        }
    }

    impl Waiter for Job {
        fn is_gone(&self) -> bool {
            self.gone.get()
        }
        fn kv_cells(&self) -> u64 {
            self.cells
        }
    }

    fn state(slots: usize, queue: usize) -> State<Job> {
        State::new(slots, queue, Duration::from_secs(10), 1_000_000)
    }

    #[test]
    fn head_of_queue_waits_for_kv_cells_without_being_overtaken() {
        let now = Instant::now();
        let mut s: State<Job> = State::new(4, 8, Duration::from_secs(10), 1000);
        s.offer(Job::sized(0, 600), now).ok();
        let first = s.admit(now).expect("fits");
        s.offer(Job::sized(1, 600), now).ok();
        s.offer(Job::sized(2, 100), now).ok();
        assert!(
            s.admit(now).is_none(),
            "600 more cells do not fit; 100 must not overtake"
        );
        assert_eq!(s.kv_reserved(), 600);
        s.release(first.slot);
        assert_eq!(s.kv_reserved(), 0);
        assert_eq!(s.admit(now).map(|a| a.job.id), Some(1));
        assert_eq!(s.admit(now).map(|a| a.job.id), Some(2));
        assert_eq!(s.kv_reserved(), 700);
    }

    #[test]
    fn waiter_short_of_cells_times_out_like_any_waiter() {
        let t0 = Instant::now();
        let mut s: State<Job> = State::new(2, 8, Duration::from_secs(1), 1000);
        s.offer(Job::sized(0, 900), t0).ok();
        let _running = s.admit(t0).expect("fits");
        s.offer(Job::sized(1, 900), t0).ok();
        assert!(s.admit(t0).is_none());
        let expired = s.expire(t0 + Duration::from_secs(2));
        assert_eq!(expired.len(), 1);
    }

    #[test]
    fn jobs_start_in_fifo_order() {
        let now = Instant::now();
        let mut s = state(1, 4);
        for id in 0..3 {
            assert!(s.offer(Job::new(id), now).is_ok());
        }
        let first = s.admit(now).expect("slot free");
        assert_eq!(first.job.id, 0);
        assert!(s.admit(now).is_none(), "only one slot");
        s.release(first.slot);
        assert_eq!(s.admit(now).map(|a| a.job.id), Some(1));
    }

    #[test]
    fn full_queue_rejects_new_work() {
        let now = Instant::now();
        let mut s = state(1, 1);
        s.offer(Job::new(0), now).ok();
        let _running = s.admit(now).expect("slot");
        assert!(s.offer(Job::new(1), now).is_ok(), "queue has room for one");
        let err = s.offer(Job::new(2), now).err().map(|(r, j)| (r, j.id));
        assert_eq!(err, Some((Rejected::QueueFull { capacity: 1 }, 2)));
    }

    #[test]
    fn zero_queue_still_accepts_when_a_slot_is_free() {
        let now = Instant::now();
        let mut s = state(2, 0);
        assert!(s.offer(Job::new(0), now).is_ok());
        let _a = s.admit(now);
        assert!(s.offer(Job::new(1), now).is_ok());
        let _b = s.admit(now);
        assert!(s.offer(Job::new(2), now).is_err());
    }

    #[test]
    fn waiter_that_left_is_skipped_at_dequeue() {
        let now = Instant::now();
        let mut s = state(1, 4);
        let leaver = Job::new(0);
        s.offer(leaver.clone(), now).ok();
        s.offer(Job::new(1), now).ok();
        leaver.gone.set(true);
        assert_eq!(s.admit(now).map(|a| a.job.id), Some(1));
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn waiter_that_left_does_not_cause_a_429() {
        let now = Instant::now();
        let mut s = state(1, 1);
        s.offer(Job::new(0), now).ok();
        let _running = s.admit(now);
        let leaver = Job::new(1);
        s.offer(leaver.clone(), now).ok();
        leaver.gone.set(true);
        // No drop_gone in between: offer itself must not count the leaver.
        assert!(s.offer(Job::new(2), now).is_ok());
    }

    #[test]
    fn gone_waiters_free_queue_room() {
        let now = Instant::now();
        let mut s = state(1, 1);
        s.offer(Job::new(0), now).ok();
        let _running = s.admit(now);
        let waiting = Job::new(1);
        s.offer(waiting.clone(), now).ok();
        waiting.gone.set(true);
        assert_eq!(s.drop_gone(), 1);
        assert!(s.offer(Job::new(2), now).is_ok());
    }

    #[test]
    fn only_waiters_past_the_timeout_expire() {
        let t0 = Instant::now();
        let mut s = state(1, 4);
        s.offer(Job::new(0), t0).ok();
        let _running = s.admit(t0);
        s.offer(Job::new(1), t0).ok();
        s.offer(Job::new(2), t0 + Duration::from_secs(5)).ok();
        let expired = s.expire(t0 + Duration::from_secs(11));
        assert_eq!(expired.iter().map(|j| j.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.queued(), 1);
        assert_eq!(s.active(), 1, "running work never expires");
    }

    #[test]
    fn admission_reports_the_wait() {
        let t0 = Instant::now();
        let mut s = state(1, 1);
        s.offer(Job::new(0), t0).ok();
        let a = s.admit(t0 + Duration::from_millis(250)).expect("slot");
        assert_eq!(a.waited, Duration::from_millis(250));
    }

    #[test]
    fn lowered_cap_holds_back_new_admissions_but_not_running_work() {
        let now = Instant::now();
        let mut s = state(4, 8);
        for id in 0..4 {
            s.offer(Job::new(id), now).ok();
        }
        let a = s.admit(now).expect("slot");
        let _b = s.admit(now).expect("slot");
        s.set_max_active(2);
        assert!(s.admit(now).is_none(), "cap of two reached");
        assert_eq!(s.active(), 2);
        s.release(a.slot);
        assert!(s.admit(now).is_some());
    }

    #[test]
    fn release_makes_a_slot_reusable() {
        let now = Instant::now();
        let mut s = state(1, 2);
        s.offer(Job::new(0), now).ok();
        let a = s.admit(now).expect("slot");
        s.release(a.slot);
        assert_eq!(s.active(), 0);
        s.offer(Job::new(1), now).ok();
        assert_eq!(s.admit(now).map(|x| x.slot), Some(a.slot));
    }
}
