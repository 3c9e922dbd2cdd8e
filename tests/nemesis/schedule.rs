//! The nemesis's fault schedule: a pure function of a seed, so a run is reproducible and a
//! failing seed can be replayed. Faults overlap at random; each is held for a while and then
//! undone (a killed or stopped container started again, a paused one resumed, a cut one
//! connected again). Two rules keep every run one the cluster must survive: a target has one
//! fault at a time, and at most one NATS node is faulted at a time (R3 keeps its quorum, so
//! every acknowledged write must survive; taking the quorum away only stalls the cluster).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// What a fault does to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL, then started again after the hold.
    Kill,
    /// `docker pause` (the cgroup freezer: every process of the container stops at once, as a
    /// paused VM or a stop-the-world stall would), resumed after the hold.
    Pause,
    /// Cut off the cluster's network, connected again after the hold.
    Partition,
    /// A polite stop of a NATS node (its disk-backed store kept), started after the hold.
    Stop,
}

/// How long a pause lasts against the lease and the retry delay: the three cases that matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseLength {
    /// Shorter than a lease: nothing may be declared lost.
    Short,
    /// Longer than a lease: the paused runner's attempts are declared lost and retried.
    Long,
    /// Longer than a lease plus the retry delay: the paused process wakes after a retry was due.
    AcrossRetry,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// From the start of the run.
    pub at: Duration,
    pub kind: Kind,
    /// A container of the cluster: `nats-<k>`, `coordinator-<k>`, `dispatcher`, `runner-<k>`.
    pub target: String,
    pub hold: Duration,
    /// For a pause, which of the three lengths it was drawn as.
    pub pause: Option<PauseLength>,
}

impl Fault {
    pub fn until(&self) -> Duration {
        self.at + self.hold
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match (self.kind, self.pause) {
            (Kind::Pause, Some(p)) => format!("pause ({p:?})"),
            (k, _) => format!("{k:?}").to_lowercase(),
        };
        write!(
            f,
            "{:>7.1}s..{:>7.1}s {kind} {}",
            self.at.as_secs_f64(),
            self.until().as_secs_f64(),
            self.target
        )
    }
}

/// The cluster a schedule is drawn for.
#[derive(Clone, Debug)]
pub struct Shape {
    pub nats: usize,
    pub coordinators: usize,
    pub runners: usize,
    pub lease: Duration,
    pub retry_delay: Duration,
}

impl Shape {
    fn targets(&self) -> Vec<String> {
        let mut t: Vec<String> = (1..=self.nats).map(|k| format!("nats-{k}")).collect();
        t.extend((1..=self.coordinators).map(|k| format!("coordinator-{k}")));
        t.push("dispatcher".into());
        t.extend((1..=self.runners).map(|k| format!("runner-{k}")));
        t
    }
}

fn is_nats(target: &str) -> bool {
    target.starts_with("nats-")
}

/// The kinds a target can suffer: partitions for runners and coordinators (the roles whose
/// cut-off the protocol has to fence), a polite stop for NATS nodes.
fn kinds_for(target: &str) -> &'static [Kind] {
    if is_nats(target) {
        &[Kind::Kill, Kind::Pause, Kind::Stop]
    } else if target.starts_with("runner-") || target.starts_with("coordinator-") {
        &[Kind::Kill, Kind::Pause, Kind::Partition]
    } else {
        &[Kind::Kill, Kind::Pause]
    }
}

/// What a schedule must contain, drawn first (in a seeded order) so that every run, even a short
/// one, has each: a kill of a role and of a node, the three pause lengths, both partitions, a stop.
/// A fault every schedule has: its kind, its pause length, and which targets may take it.
type Wanted = (Kind, Option<PauseLength>, fn(&str) -> bool);

fn coverage() -> Vec<Wanted> {
    vec![
        (Kind::Kill, None, |t| !is_nats(t)),
        (Kind::Kill, None, is_nats),
        (Kind::Pause, Some(PauseLength::Short), |t| {
            t.starts_with("runner-")
        }),
        (Kind::Pause, Some(PauseLength::Long), |t| {
            t.starts_with("runner-")
        }),
        (Kind::Pause, Some(PauseLength::AcrossRetry), |t| {
            t.starts_with("runner-")
        }),
        (Kind::Pause, Some(PauseLength::Long), |t| {
            t.starts_with("coordinator-")
        }),
        (Kind::Pause, None, is_nats),
        (Kind::Partition, None, |t| t.starts_with("runner-")),
        (Kind::Partition, None, |t| t.starts_with("coordinator-")),
        (Kind::Stop, None, is_nats),
    ]
}

fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

fn hold(rng: &mut StdRng, shape: &Shape, kind: Kind, pause: Option<PauseLength>) -> Duration {
    let lease = shape.lease.as_secs_f64();
    let retry = shape.retry_delay.as_secs_f64();
    match kind {
        Kind::Kill => secs(rng, 1.0, 8.0),
        Kind::Stop => secs(rng, 3.0, 15.0),
        Kind::Partition => secs(rng, 2.0, 2.5 * lease),
        Kind::Pause => match pause.unwrap_or(PauseLength::Short) {
            PauseLength::Short => secs(rng, 0.2 * lease, 0.7 * lease),
            PauseLength::Long => secs(rng, 1.3 * lease, 2.0 * lease),
            PauseLength::AcrossRetry => secs(rng, 1.5 * lease + retry, 2.5 * lease + retry),
        },
    }
}

fn pause_length(rng: &mut StdRng) -> PauseLength {
    match rng.random_range(0..3) {
        0 => PauseLength::Short,
        1 => PauseLength::Long,
        _ => PauseLength::AcrossRetry,
    }
}

/// Whether `f` may join `taken`: its target free for its whole span, and no other NATS node
/// faulted meanwhile when it is one.
fn fits(taken: &[Fault], f: &Fault) -> bool {
    taken.iter().all(|o| {
        let overlap = o.at < f.until() && f.at < o.until();
        !(overlap && (o.target == f.target || (is_nats(&o.target) && is_nats(&f.target))))
    })
}

/// The faults of a run of `length`, from `seed`: one starts every 2 to 10 s, each ends by
/// `length`. Faults that do not fit (their target busy) are drawn again on another target.
pub fn plan(seed: u64, length: Duration, shape: &Shape) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let targets = shape.targets();
    let mut wanted = coverage();
    // A seeded shuffle: the coverage faults come first, in an order of the seed's choosing.
    for i in (1..wanted.len()).rev() {
        let j = rng.random_range(0..=i);
        wanted.swap(i, j);
    }
    let mut wanted = wanted.into_iter();
    let mut out: Vec<Fault> = Vec::new();
    let mut at = secs(&mut rng, 1.0, 4.0);
    while at < length {
        let must = wanted.next();
        let mut placed = false;
        for _ in 0..32 {
            let target = &targets[rng.random_range(0..targets.len())];
            let (kind, pause) = match must {
                Some((kind, pause, ok)) => {
                    if !ok(target) {
                        continue;
                    }
                    (
                        kind,
                        pause.or_else(|| (kind == Kind::Pause).then(|| pause_length(&mut rng))),
                    )
                }
                None => {
                    let kinds = kinds_for(target);
                    let kind = kinds[rng.random_range(0..kinds.len())];
                    (kind, (kind == Kind::Pause).then(|| pause_length(&mut rng)))
                }
            };
            let hold = hold(&mut rng, shape, kind, pause);
            if at + hold > length {
                continue;
            }
            let f = Fault {
                at,
                kind,
                target: target.clone(),
                hold,
                pause,
            };
            if fits(&out, &f) {
                out.push(f);
                placed = true;
                break;
            }
        }
        // A coverage fault that found no room now is tried again at the next start.
        if !placed {
            if let Some(m) = must {
                let rest: Vec<_> = std::iter::once(m).chain(wanted).collect();
                wanted = rest.into_iter();
            }
        }
        at += secs(&mut rng, 2.0, 10.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            nats: 3,
            coordinators: 2,
            runners: 3,
            lease: Duration::from_secs(6),
            retry_delay: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_seed_gives_one_schedule() {
        let len = Duration::from_secs(300);
        assert_eq!(plan(7, len, &shape()), plan(7, len, &shape()));
        assert_ne!(plan(7, len, &shape()), plan(8, len, &shape()));
    }

    #[test]
    fn every_schedule_keeps_the_rules_and_covers_every_fault() {
        let len = Duration::from_secs(300);
        for seed in 0..300 {
            let p = plan(seed, len, &shape());
            for (i, f) in p.iter().enumerate() {
                assert!(f.until() <= len, "seed {seed}: {f} ends after the run");
                assert!(kinds_for(&f.target).contains(&f.kind), "seed {seed}: {f}");
                assert!(fits(&p[..i], f), "seed {seed}: {f} overlaps");
                assert_eq!(f.kind == Kind::Pause, f.pause.is_some(), "seed {seed}: {f}");
            }
            for (kind, pause, ok) in coverage() {
                assert!(
                    p.iter().any(|f| f.kind == kind
                        && (pause.is_none() || f.pause == pause)
                        && ok(&f.target)),
                    "seed {seed}: no {kind:?} {pause:?} in\n{}",
                    p.iter()
                        .map(|f| f.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            // Faults overlap: the point of a nemesis over the scripted cases.
            assert!(
                p.windows(2).any(|w| w[1].at < w[0].until()),
                "seed {seed}: no two faults overlap"
            );
        }
    }

    #[test]
    fn pauses_are_as_long_as_drawn() {
        let s = shape();
        for seed in 0..200 {
            for f in plan(seed, Duration::from_secs(300), &s) {
                match f.pause {
                    Some(PauseLength::Short) => assert!(f.hold < s.lease, "{f}"),
                    Some(PauseLength::Long) => assert!(f.hold > s.lease, "{f}"),
                    Some(PauseLength::AcrossRetry) => {
                        assert!(f.hold > s.lease + s.retry_delay, "{f}")
                    }
                    None => {}
                }
            }
        }
    }
}
