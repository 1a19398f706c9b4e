//! The admission rules of [`State`](super::State), on plain jobs and hand-picked instants.

use std::time::{Duration, Instant};

use super::state::*;
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
fn prefix_slots_add_sequences_to_pick_from_but_no_running_job() {
    let now = Instant::now();
    let mut s = state(1, 4).with_prefix_slots(2);
    assert_eq!(s.slots(), 1);
    s.offer(Job::sized(0, 10), now).ok();
    s.offer(Job::sized(1, 10), now).ok();
    let first = s.admit_to(now, |_, free| {
        assert_eq!(free, [0, 1, 2]);
        2
    });
    assert_eq!(first.map(|a| a.slot), Some(2), "any idle sequence");
    assert!(s.admit(now).is_none(), "one slot: one job at a time");
    s.set_max_active(3);
    assert!(s.admit(now).is_none(), "the cap never exceeds the slots");
    s.release(2);
    assert_eq!(s.admit(now).map(|a| a.job.id), Some(1));
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
fn burst_on_an_idle_server_fills_every_slot_before_the_queue() {
    // Regression: four requests arriving together with `--slots 4 --queue 1` got two
    // 429s, because the queue was judged by its raw length before any admission.
    let now = Instant::now();
    let mut s = state(4, 1);
    for id in 0..5 {
        assert!(s.offer(Job::new(id), now).is_ok(), "job {id} refused");
    }
    assert!(s.offer(Job::new(5), now).is_err(), "4 slots + 1 queued");
    let started: Vec<u32> = std::iter::from_fn(|| s.admit(now).map(|a| a.job.id)).collect();
    assert_eq!(started, vec![0, 1, 2, 3]);
    assert_eq!(s.queued(), 1);
}

#[test]
fn burst_of_32_over_4_slots_and_8_queued_refuses_exactly_20() {
    let now = Instant::now();
    let mut s = state(4, 8);
    let refused = (0..32)
        .filter(|id| s.offer(Job::new(*id), now).is_err())
        .count();
    assert_eq!(refused, 20);
}

#[test]
fn burst_respects_the_thermal_cap_and_kv_cells() {
    let now = Instant::now();
    let mut s: State<Job> = State::new(4, 1, Duration::from_secs(10), 1000);
    s.set_max_active(2);
    assert!(s.offer(Job::sized(0, 400), now).is_ok());
    assert!(s.offer(Job::sized(1, 400), now).is_ok());
    assert!(
        s.offer(Job::sized(2, 100), now).is_ok(),
        "queued behind the cap"
    );
    assert!(s.offer(Job::sized(3, 100), now).is_err(), "cap 2 + queue 1");
    let mut s: State<Job> = State::new(4, 1, Duration::from_secs(10), 1000);
    assert!(s.offer(Job::sized(0, 900), now).is_ok());
    assert!(s.offer(Job::sized(1, 900), now).is_ok(), "waits for cells");
    assert!(
        s.offer(Job::sized(2, 10), now).is_err(),
        "FIFO: blocked behind 1"
    );
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
    assert_eq!(s.take_departed(), 1, "the leaver counts as a cancellation");
    assert_eq!(s.take_departed(), 0);
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
    assert_eq!(s.take_departed(), 1);
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

#[test]
fn a_group_starts_whole_once_there_are_cells_for_all_of_it() {
    let now = Instant::now();
    let mut s = State::new(3, 4, Duration::from_secs(10), 90);
    s.offer(Job::sized(0, 40), now).ok();
    let running = s.admit(now).expect("fits");
    s.offer_group(vec![Job::sized(1, 30), Job::sized(2, 30)], now)
        .ok()
        .expect("queued");
    // Its first job alone would fit (40 + 30 ≤ 90), the group does not (40 + 60).
    assert!(s.admit(now).is_none(), "no partial start");
    s.release(running.slot);
    let first = s.admit(now).expect("the group's first job");
    assert_eq!((first.job.id, first.follows), (1, false));
    let second = s.admit(now).expect("the rest follows at once");
    assert_eq!((second.job.id, second.follows), (2, true));
    assert_eq!(s.active(), 2);
}

#[test]
fn a_group_waits_for_as_many_free_slots_as_it_has_jobs() {
    let now = Instant::now();
    let mut s = state(2, 4);
    s.offer(Job::new(0), now).ok();
    let running = s.admit(now).expect("slot");
    s.offer_group(vec![Job::new(1), Job::new(2)], now)
        .ok()
        .expect("queued");
    assert!(s.admit(now).is_none(), "one slot free, two needed");
    assert_eq!(s.queued(), 2);
    s.release(running.slot);
    assert_eq!(s.admit(now).map(|a| a.job.id), Some(1));
    assert_eq!(s.admit(now).map(|a| a.job.id), Some(2));
}

#[test]
fn a_group_the_queue_cannot_hold_is_refused_whole() {
    let now = Instant::now();
    let mut s = state(1, 1);
    s.offer(Job::new(0), now).ok();
    let _running = s.admit(now).expect("slot");
    let refused = s.offer_group(vec![Job::new(1), Job::new(2)], now);
    let (why, jobs) = refused.expect_err("two waiters, room for one");
    assert_eq!(why, Rejected::QueueFull { capacity: 1 });
    assert_eq!(jobs.len(), 2);
    assert_eq!(s.queued(), 0, "nothing of the group is left queued");
}
