//! The sharding scenarios: what traffic a job sees, how the assigner observes it, and
//! what happens to its tasks; and, for the placement scenarios, where the tasks sit and
//! what the job asks of their placement ([`Topology`]).

use std::fmt;

use steady_assigner::{Placement, Spread, TaskProfile};

use super::workload::Shift;

/// A change of the task set at a step, applied before that step's assigner run (the
/// Assigner runs at once on a task-set change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Task `task` fails: it is gone from the job.
    Fail {
        /// The step.
        at: usize,
        /// The task.
        task: u32,
    },
    /// A new task joins, with the next unused index.
    Add {
        /// The step.
        at: usize,
    },
    /// Task `task`, failed before, serves again (same index, same zone and capacity).
    Return {
        /// The step.
        at: usize,
        /// The task.
        task: u32,
    },
}

impl Event {
    /// The step it happens at.
    pub fn at(&self) -> usize {
        match *self {
            Self::Fail { at, .. } | Self::Add { at } | Self::Return { at, .. } => at,
        }
    }
}

/// Where a placement scenario's tasks sit, how much load each takes, and the constraints
/// the job asks for: what a job spec (`steady_assigner::JobSpec`) gives an Assigner.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Task `t` is in zone `zones[t % zones.len()]` (empty: tasks have no zone).
    pub zones: Vec<String>,
    /// Task `t` has capacity `capacities[t % capacities.len()]` (empty: every task 1).
    pub capacities: Vec<f64>,
    /// The constraints, passed to every run.
    pub placement: Placement,
    /// The fewest replicas per slice (the most is [`Scenario::max_replicas`]).
    pub min_replicas: usize,
}

impl Topology {
    /// Tasks round-robin over zones `a`, `b`, `c`, every task capacity 1, no constraint.
    pub fn three_zones() -> Self {
        Self {
            zones: ["a", "b", "c"].map(String::from).to_vec(),
            capacities: Vec::new(),
            placement: Placement::default(),
            min_replicas: 1,
        }
    }

    /// Task `t`'s profile.
    pub fn profile(&self, t: u32) -> TaskProfile {
        let cycle = |n: usize| t as usize % n;
        TaskProfile {
            zone: (!self.zones.is_empty()).then(|| self.zones[cycle(self.zones.len())].clone()),
            rack: None,
            capacity: if self.capacities.is_empty() {
                1.0
            } else {
                self.capacities[cycle(self.capacities.len())]
            },
        }
    }
}

/// One simulated job.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// A short name (`slicer-5.2.3`, `day-t20-z1.2`, ...).
    pub name: String,
    /// Distinct keys.
    pub keys: usize,
    /// The Zipf exponent of their popularity.
    pub exponent: f64,
    /// Requests per second in total (the mean, for a diurnal day).
    pub rate: f64,
    /// How popularity moves.
    pub shift: Shift,
    /// Tasks at the start, indices `0..tasks`.
    pub tasks: u32,
    /// Task failures and additions.
    pub events: Vec<Event>,
    /// Simulated seconds per step. The assigner runs once per step.
    pub step_seconds: f64,
    /// The assigner sees the mean load of this many steps...
    pub window: usize,
    /// ...ending this many steps before its run (monitoring delay).
    pub delay: usize,
    /// Steps simulated.
    pub steps: usize,
    /// Most replicas per slice.
    pub max_replicas: usize,
    /// The seed of the popularity rankings and of the sampled counts.
    pub seed: u64,
    /// Zones, capacities and constraints (`None`: tasks are equal, nothing is asked of
    /// their placement, as in the standard scenarios).
    pub topology: Option<Topology>,
}

impl Scenario {
    /// Steps before the assigner's window first holds a full window of load: metrics
    /// skip them.
    pub fn warm_up(&self) -> usize {
        self.window + self.delay
    }

    /// The steps at which the hot keys move (after the warm-up), for a scenario that
    /// reshuffles them.
    pub fn shifts(&self) -> Vec<usize> {
        match self.shift {
            Shift::Every { steps } if steps > 1 => (1..)
                .map(|i| i * steps)
                .take_while(|&s| s < self.steps)
                .filter(|&s| s >= self.warm_up())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Steps between hot-key shifts, for a scenario that reshuffles them.
    pub fn shifts_period(&self) -> Option<usize> {
        match self.shift {
            Shift::Every { steps } => Some(steps.max(1)),
            _ => None,
        }
    }

    /// Steps per simulated hour (at least 1).
    pub fn steps_per_hour(&self) -> usize {
        ((3600.0 / self.step_seconds).round() as usize).max(1)
    }

    /// The reaction experiment of Slicer (OSDI 2016), section 5.2.3: 100 keys with Zipf 1.5
    /// popularity, 8,000
    /// requests per second, 10 tasks, the hottest load moved to other keys every 19
    /// minutes; 1-minute steps, a 5-minute window seen with a 1-minute delay; 21 periods.
    /// Up to 10 replicas per slice (Slicer's asymmetric replication: the hottest key
    /// alone carries 40% of the load, four times a task's share).
    pub fn slicer_reaction() -> Self {
        Self {
            name: "slicer-5.2.3".into(),
            keys: 100,
            exponent: 1.5,
            rate: 8000.0,
            shift: Shift::Every { steps: 19 },
            tasks: 10,
            events: Vec::new(),
            step_seconds: 60.0,
            window: 5,
            delay: 1,
            steps: 19 * 21,
            max_replicas: 10,
            seed: 0x5_2_3,
            topology: None,
        }
    }

    /// A day of a larger job: 100,000 keys, `tasks` tasks, Zipf `exponent`, 10,000
    /// requests per second on average with a diurnal swing of 30% and the hot keys
    /// drifting from one ranking at midnight to another at noon; task 3 fails at 08:00
    /// and a task joins at 16:00. 1-minute steps, 5-minute window, 1-minute delay, up to
    /// 8 replicas per slice.
    pub fn day(tasks: u32, exponent: f64) -> Self {
        Self {
            name: format!("day-t{tasks}-z{exponent}"),
            keys: 100_000,
            exponent,
            rate: 10_000.0,
            shift: Shift::Diurnal { day_steps: 1440, swing: 0.3 },
            tasks,
            events: vec![Event::Fail { at: 480, task: 3 }, Event::Add { at: 960 }],
            step_seconds: 60.0,
            window: 5,
            delay: 1,
            steps: 1440,
            max_replicas: 8,
            seed: u64::from(tasks) << 8 | (exponent * 10.0) as u64,
            topology: None,
        }
    }

    /// Rudolph's stress case: 10,000 keys, Zipf 1.0, 10 tasks, 20,000 requests per
    /// second, every ranking reshuffled every 10 s; 10-second steps, a 30-second window
    /// seen one step late; one hour.
    pub fn stress() -> Self {
        Self {
            name: "stress-10s".into(),
            keys: 10_000,
            exponent: 1.0,
            rate: 20_000.0,
            shift: Shift::Every { steps: 1 },
            tasks: 10,
            events: Vec::new(),
            step_seconds: 10.0,
            window: 3,
            delay: 1,
            steps: 360,
            max_replicas: 8,
            seed: 0x10,
            topology: None,
        }
    }

    /// Every scenario of the evaluation: the reaction experiment, twelve days (10, 20
    /// and 50 tasks, Zipf 0.8, 1.0, 1.2 and 1.5) and the stress case.
    pub fn standard() -> Vec<Self> {
        let mut all = vec![Self::slicer_reaction()];
        for tasks in [10, 20, 50] {
            for exponent in [0.8, 1.0, 1.2, 1.5] {
                all.push(Self::day(tasks, exponent));
            }
        }
        all.push(Self::stress());
        all
    }

    /// The placement scenarios (their names start with `placement`): the reaction
    /// experiment's job with its tasks in three zones (`a`, `b`, `c`, task `t` in the
    /// `t % 3`-th), asking for
    /// * `placement-spread-5.2.3`: two replicas per slice in distinct zones;
    /// * `placement-per-zone-5.2.3`: three replicas, one in every zone;
    /// * `placement-capacity-5.2.3`: no constraint, but every even task has capacity 2;
    /// * `placement-outage-5.2.3`: two replicas in distinct zones while zone `c`'s tasks
    ///   all fail at step 100 and return at step 200;
    /// * `placement-outage-per-zone-5.2.3`: three replicas, one in each of the zones `a`,
    ///   `b`, `c`, through the same outage: infeasible while `c` is down, repaired when
    ///   it returns;
    ///
    /// and a day at scale, `placement-day-t20-z1`: [`Scenario::day`]'s 20 tasks and
    /// 100,000 keys (Zipf 1.0) in three zones, every even task capacity 2, two replicas per
    /// slice in distinct zones.
    pub fn placement() -> Vec<Self> {
        let spread = Placement { spread: Spread::Zones, ..Placement::default() };
        let per_zone = Placement {
            replica_per_zone: true,
            zones: ["a", "b", "c"].map(String::from).to_vec(),
            ..Placement::default()
        };
        let base = Self::slicer_reaction();
        let variant = |name: &str, max_replicas: usize, topology: Topology| Self {
            name: format!("placement-{name}-5.2.3"),
            max_replicas,
            topology: Some(topology),
            ..base.clone()
        };
        // Zone c: tasks 2, 5 and 8.
        let outage: Vec<Event> = [2, 5, 8]
            .map(|task| Event::Fail { at: 100, task })
            .into_iter()
            .chain([2, 5, 8].map(|task| Event::Return { at: 200, task }))
            .collect();
        let spread_two = Topology { placement: spread.clone(), min_replicas: 2, ..Topology::three_zones() };
        let per_zone_three = Topology { placement: per_zone, min_replicas: 3, ..Topology::three_zones() };
        let capacity = Topology { capacities: vec![2.0, 1.0], ..Topology::three_zones() };
        let day = Self::day(20, 1.0);
        vec![
            variant("spread", 2, spread_two.clone()),
            variant("per-zone", 3, per_zone_three.clone()),
            variant("capacity", base.max_replicas, capacity),
            Self { events: outage.clone(), ..variant("outage", 2, spread_two) },
            Self { events: outage, ..variant("outage-per-zone", 3, per_zone_three) },
            Self {
                name: format!("placement-{}", day.name),
                max_replicas: 2,
                topology: Some(Topology {
                    capacities: vec![2.0, 1.0],
                    placement: spread,
                    min_replicas: 2,
                    ..Topology::three_zones()
                }),
                ..day
            },
        ]
    }

    /// Every scenario `steady-lab sharding` knows: [`Scenario::standard`], then
    /// [`Scenario::placement`].
    pub fn all() -> Vec<Self> {
        let mut all = Self::standard();
        all.extend(Self::placement());
        all
    }

    /// The same scenario shortened for tests and `--quick`: at most `steps` steps and
    /// `keys` keys, events moved to fit.
    pub fn shortened(mut self, steps: usize, keys: usize) -> Self {
        let scale = steps as f64 / self.steps as f64;
        if scale < 1.0 {
            self.steps = steps;
            for event in &mut self.events {
                match event {
                    Event::Fail { at, .. } | Event::Add { at } | Event::Return { at, .. } => {
                        *at = (*at as f64 * scale) as usize
                    }
                }
            }
            if let Shift::Diurnal { day_steps, .. } = &mut self.shift {
                *day_steps = steps;
            }
        }
        self.keys = self.keys.min(keys);
        self
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shift = match self.shift {
            Shift::None => "fixed popularity".to_string(),
            Shift::Every { steps } => {
                format!("hot keys reshuffled every {} s", steps as f64 * self.step_seconds)
            }
            Shift::Diurnal { swing, .. } => format!("diurnal drift, rate swing {:.0}%", swing * 100.0),
        };
        write!(
            f,
            "{}: {} keys, Zipf {}, {} req/s, {} tasks, {shift}, {} steps of {} s, window {} delay {}, max {} replicas",
            self.name,
            self.keys,
            self.exponent,
            self.rate,
            self.tasks,
            self.steps,
            self.step_seconds,
            self.window,
            self.delay,
            self.max_replicas,
        )?;
        if let Some(t) = &self.topology {
            let p = &t.placement;
            let mut asks = Vec::new();
            if p.spread != Spread::None {
                asks.push(format!("replicas in distinct {}", p.spread.name()));
            }
            if p.replica_per_zone {
                asks.push("a replica per zone".to_string());
            }
            if asks.is_empty() {
                asks.push("no constraint".to_string());
            }
            let capacities = if t.capacities.is_empty() {
                "capacity 1".to_string()
            } else {
                let list: Vec<String> = t.capacities.iter().map(f64::to_string).collect();
                format!("capacities {} (cycled)", list.join("/"))
            };
            write!(
                f,
                "; {} zones, {capacities}, min {} replicas, {}",
                t.zones.len(),
                t.min_replicas,
                asks.join(" and ")
            )?;
        }
        Ok(())
    }
}
