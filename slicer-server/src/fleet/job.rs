//! One job as an instance serves it: its assignment followed from the store (into the
//! Distributor, and into the load book while no Assigner leads it here), its tasks'
//! names for A119 clients, and its Assigner, while the spread gives it this instance.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use steady_assigner::Tasks;
use steady_slice::Assignment;
use steady_slicer::assigner_service::{AssignerHandle, AssignerService, AssignerStats};
use steady_slicer::autosharding::EndpointNames;
use steady_slicer::load::LoadBook;
use steady_slicer::specs::JobConfig;
use steady_slicer::{AssignmentStore, Distributor};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::gate::Gate;
use super::sources::{self, Registries};
use super::{halted, Halt, Tune, FIRST_RESTART, MAX_RESTART};

/// What every job's parts share on one instance.
#[derive(Debug, Clone)]
pub(super) struct Shared {
    pub(super) instance: String,
    pub(super) store: Arc<dyn AssignmentStore>,
    pub(super) distributor: Distributor,
    pub(super) book: LoadBook,
    pub(super) registries: Registries,
    pub(super) events: super::Events,
    /// Jobs whose tasks the program gives ([`super::Fleet::tasks_from`]).
    pub(super) given_tasks: Arc<std::collections::BTreeMap<String, watch::Receiver<Tasks>>>,
    pub(super) tune: Option<Tune>,
    /// Where the jobs name their tasks for A119 clients (`Fleet::endpoint_names`).
    pub(super) endpoint_names: Option<EndpointNames>,
    /// Wakes the control task when what its status shows of a job changed outside it (an
    /// Assigner here started or stopped, its task set answered), so that the pages show
    /// it at once rather than at the next health check.
    pub(super) changed: Arc<Notify>,
}

/// One job on this instance.
pub(super) struct Job {
    pub(super) config: Arc<JobConfig>,
    follower: JoinHandle<()>,
    /// Set when the job is removed: the follower publishes nothing after that (it is
    /// aborted too, but an abort lands only at its next await).
    removed: Gate,
    /// This instance's Assigner of the job, while it runs here.
    assigner: Option<Assigner>,
    /// The stats of the Assigner running here (`None` while none does), which the
    /// follower reads to leave the book to a leading Assigner.
    stats: watch::Sender<Option<Arc<AssignerStats>>>,
    /// The Assigner handed over last, while it resigns: the next one here starts after
    /// it (on a session lease a campaign would find the old term's key its own).
    resigning: Option<JoinHandle<()>>,
    /// What keeps its tasks' names for A119 clients, when the program wants them and its
    /// source has addresses.
    naming: Option<sources::Naming>,
}

/// The task that runs the job's Assigner here, and how to steer it.
struct Assigner {
    stop: watch::Sender<Halt>,
    task: JoinHandle<()>,
    drained: watch::Sender<BTreeSet<u32>>,
    run_now: Arc<Notify>,
    /// The task set it follows, once its source answered.
    tasks: watch::Receiver<Option<watch::Receiver<Tasks>>>,
}

impl Job {
    /// Starts following `config`'s job: the store's assignment into the Distributor (and
    /// the book). Its Assigner starts with [`Job::lead`], after `resigning` (the Assigner
    /// of the job here before it was removed, if it has not finished resigning).
    pub(super) fn follow(config: JobConfig, shared: &Shared, resigning: Option<JoinHandle<()>>) -> Self {
        let (stats, leading_here) = watch::channel(None);
        let removed = Gate::default();
        let follower =
            tokio::spawn(follow_store(config.job.clone(), shared.clone(), leading_here, removed.clone()));
        let naming = Self::naming(&config, shared);
        Self { config: Arc::new(config), follower, removed, assigner: None, stats, resigning, naming }
    }

    /// Its tasks' naming: from its spec's source, unless the program gives its tasks
    /// ([`super::Fleet::tasks_from`]: then they are named by their index).
    fn naming(config: &JobConfig, shared: &Shared) -> Option<sources::Naming> {
        let names = shared.endpoint_names.as_ref()?;
        if shared.given_tasks.contains_key(&config.job) {
            return None;
        }
        sources::name_tasks(&config.job, &config.tasks, &shared.registries, names)
    }

    /// Whether its Assigner runs here.
    pub(super) fn runs_here(&self) -> bool {
        self.assigner.is_some()
    }

    /// The stats of its Assigner here, once started.
    pub(super) fn stats(&self) -> Option<Arc<AssignerStats>> {
        self.stats.borrow().clone()
    }

    /// The task set its Assigner here follows, once its source answered.
    pub(super) fn tasks(&self) -> Option<watch::Receiver<Tasks>> {
        self.assigner.as_ref().and_then(|a| a.tasks.borrow().clone())
    }

    /// Starts its Assigner here (campaigning for the job's leadership), if it is not
    /// running already.
    pub(super) fn lead(&mut self, shared: &Shared) {
        if self.assigner.is_some() {
            return;
        }
        let (stop, stopped) = watch::channel(Halt::Run);
        let (drained, drained_rx) = watch::channel(self.config.drained.clone());
        let run_now = Arc::new(Notify::new());
        let (tasks_tx, tasks) = watch::channel(None);
        let run = RunAssigner {
            after: self.resigning.take(),
            config: self.config.clone(),
            shared: shared.clone(),
            stats: self.stats.clone(),
            drained: drained_rx,
            run_now: run_now.clone(),
            tasks: tasks_tx,
        };
        let task = tokio::spawn(run.run(stopped));
        self.assigner = Some(Assigner { stop, task, drained, run_now, tasks });
    }

    /// Tells its Assigner here to stop (it resigns, so that the next owner leads at
    /// once); whether one ran.
    pub(super) fn hand_over(&mut self) -> bool {
        self.halt(Halt::Resign)
    }

    /// Stops its Assigner here as `halt` says; whether one ran.
    fn halt(&mut self, halt: Halt) -> bool {
        let Some(assigner) = self.assigner.take() else { return false };
        assigner.stop.send_replace(halt);
        self.resigning = Some(assigner.task);
        true
    }

    /// Takes a new spec: the drained set alone reaches a running Assigner live; any
    /// other change hands it over (returns whether it did: the control task starts it
    /// again on the new spec if the job is still this instance's). A new task source is
    /// named anew.
    pub(super) fn reconfigure(&mut self, config: JobConfig, shared: &Shared) -> bool {
        let only_drains =
            JobConfig { drained: self.config.drained.clone(), ..config.clone() } == *self.config;
        if config.tasks != self.config.tasks {
            // The old names go first (dropped), then the new source names the tasks.
            self.naming = None;
            self.naming = Self::naming(&config, shared);
        }
        self.config = Arc::new(config);
        if only_drains {
            if let Some(assigner) = &self.assigner {
                assigner.drained.send_replace(self.config.drained.clone());
            }
            return false;
        }
        self.hand_over()
    }

    /// Asks its Assigner here for a run now (`false`: none runs here).
    pub(super) fn run_now(&self) -> bool {
        match &self.assigner {
            Some(assigner) => {
                assigner.run_now.notify_one();
                true
            }
            None => false,
        }
    }

    /// Whether the task running its Assigner ended (it never does by itself unless the
    /// runtime shuts down).
    pub(super) fn assigner_ended(&self) -> bool {
        self.assigner.as_ref().is_some_and(|a| a.task.is_finished())
    }

    /// Stops following the job: its Assigner stops as `halt` says (resigns, or crashes;
    /// the handle to await), the follower ends, and the book forgets the job.
    pub(super) fn remove(mut self, shared: &Shared, halt: Halt) -> Option<JoinHandle<()>> {
        // Once set, no publication of the follower's is under way or to come. (Its
        // Assigner here, stopping, may still publish a run it was writing: the control
        // task takes that back once the Assigner has stopped.)
        self.removed.close();
        self.follower.abort();
        shared.book.forget(&self.config.job);
        self.halt(halt);
        self.resigning.take()
    }
}

impl Drop for Job {
    /// A job dropped without [`Job::remove`] (its control task aborted): its tasks end
    /// with it.
    fn drop(&mut self) {
        self.follower.abort();
        if let Some(assigner) = &self.assigner {
            assigner.task.abort();
        }
    }
}

/// Follows `job`'s assignment in the store for as long as the job is served here: each
/// new generation to the Distributor, and to the book (so that reports for it are kept
/// and an Assigner that starts here later has them) unless an Assigner leads the job
/// here, which keeps the book itself. A watch that ends is made again, with backoff.
async fn follow_store(
    job: String,
    shared: Shared,
    leading_here: watch::Receiver<Option<Arc<AssignerStats>>>,
    removed: Gate,
) {
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            tokio::time::sleep(steady_etcd::watch_backoff(failures)).await;
        }
        let mut watch = match shared.store.watch(&job, 0) {
            Ok(watch) => watch,
            Err(error) => {
                failures += 1;
                tracing::warn!(job, %error, "fleet: cannot watch the job's assignment");
                continue;
            }
        };
        while let Some(item) = watch.next().await {
            // A value that does not decode is the store's to report; the last good stays.
            let Ok(assignment) = item else { continue };
            failures = 0;
            let Some(_open) = removed.enter() else { return };
            let leading = leading_here.borrow().as_ref().is_some_and(|s| s.is_leading());
            if !leading {
                let tasks = tasks_named(&assignment);
                shared.book.published(&job, Arc::new(assignment.clone()), tasks);
            }
            shared.distributor.publish(&job, assignment);
        }
        failures += 1;
    }
}

/// Every task an assignment names (replicas and warming ones).
fn tasks_named(assignment: &Assignment) -> BTreeSet<u32> {
    assignment.slices().iter().flat_map(|s| s.tasks().iter().copied()).collect()
}

/// How long a new Assigner waits for the one before it to resign, at most.
const RESIGN_WAIT: Duration = Duration::from_secs(10);

/// How long after a handover a campaign's late win is looked for
/// ([`RunAssigner::release_late_win`]): a transaction in flight on the way to etcd lands
/// within it, on any network an instance and etcd share.
const LATE_WIN: Duration = Duration::from_secs(1);

/// The task that runs a job's Assigner here.
struct RunAssigner {
    /// The Assigner before this one here, resigning: waited for first.
    after: Option<JoinHandle<()>>,
    config: Arc<JobConfig>,
    shared: Shared,
    stats: watch::Sender<Option<Arc<AssignerStats>>>,
    drained: watch::Receiver<BTreeSet<u32>>,
    run_now: Arc<Notify>,
    tasks: watch::Sender<Option<watch::Receiver<Tasks>>>,
}

impl RunAssigner {
    /// Follows the job's tasks and runs its Assigner on them until `stopped`; then
    /// resigns. Started again with backoff if its tasks cannot be followed or it ends.
    async fn run(mut self, mut stopped: watch::Receiver<Halt>) {
        if let Some(mut before) = self.after.take() {
            // Stopped while waiting, this one still ends only after the one before it: the
            // next Assigner of the job here waits for this one alone, and must not start
            // while an earlier one's late-win release (which deletes the job's leader key
            // when it is on this instance's session lease) is still to come, or that
            // release would delete the next one's key, on the same lease, while it leads.
            tokio::select! {
                _ = halted(&mut stopped) => {
                    let _ = tokio::time::timeout(RESIGN_WAIT, &mut before).await;
                    return;
                }
                _ = tokio::time::timeout(RESIGN_WAIT, &mut before) => {}
            }
        }
        let job = self.config.job.as_str();
        let mut delay = FIRST_RESTART;
        loop {
            let started = tokio::select! {
                biased;
                _ = halted(&mut stopped) => return,
                started = self.start() => started,
            };
            let (handle, _followed) = match started {
                Ok(started) => started,
                Err(error) => {
                    self.shared.events.say(format!("job {job}: its Assigner cannot start here: {error}"));
                    tokio::select! {
                        _ = halted(&mut stopped) => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(MAX_RESTART);
                    continue;
                }
            };
            let mine = handle.shared_stats();
            self.stats.send_replace(Some(mine.clone()));
            self.changed();
            let started_at = tokio::time::Instant::now();
            let ended = handle.ended();
            tokio::select! {
                halt = halted(&mut stopped) => {
                    match halt {
                        Halt::Crash => handle.kill().await,
                        Halt::Run | Halt::Resign => {
                            handle.stop().await;
                            self.release_late_win(job).await;
                        }
                    }
                    self.clear_stats(&mine);
                    return;
                }
                () = ended => {
                    self.shared.events.say(format!("job {job}: its Assigner stopped by itself; starting it again"));
                    self.clear_stats(&mine);
                    // Backoff for an Assigner that keeps stopping; afresh after one that
                    // ran a while.
                    if started_at.elapsed() > MAX_RESTART {
                        delay = FIRST_RESTART;
                    }
                    tokio::select! {
                        _ = halted(&mut stopped) => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(MAX_RESTART);
                }
            }
        }
    }

    /// A campaign stopped while its winning transaction was on its way may see etcd
    /// apply it after the service released the job: on a session lease that key would
    /// stay for the session's life, and no other instance could lead the job. Released
    /// again once such a transaction has landed. (A next Assigner of the job here starts
    /// only after this task ends, so it cannot be its key.)
    async fn release_late_win(&self, job: &str) {
        tokio::time::sleep(LATE_WIN).await;
        if let Err(error) = self.shared.store.release(job).await {
            tracing::warn!(job, %error, "fleet: releasing a late campaign win failed");
        }
    }

    async fn start(
        &self,
    ) -> Result<(AssignerHandle, sources::Followed), Box<dyn std::error::Error + Send + Sync>> {
        let config = &self.config;
        let assigner = config.assigner()?;
        let mut tuned = config.assigner_config();
        if let Some(tune) = &self.shared.tune {
            tune.apply(config, &mut tuned);
        }
        let service = AssignerService::new(
            &config.job,
            &self.shared.instance,
            Arc::from(assigner),
            self.shared.store.clone(),
            self.shared.distributor.clone(),
            self.shared.book.clone(),
        )
        .config(tuned)?;
        let followed = match self.shared.given_tasks.get(&config.job) {
            Some(given) => sources::Followed::given(given.clone()),
            None => sources::follow(&config.job, &config.tasks, &self.shared.registries).await?,
        };
        let tasks = sources::with_drained(followed.tasks.clone(), self.drained.clone(), self.run_now.clone());
        self.tasks.send_replace(Some(tasks.clone()));
        self.changed();
        Ok((service.spawn(tasks), followed))
    }

    /// Takes this Assigner's stats (`mine`) off the job, unless a later Assigner of the
    /// job here has put its own (one that stopped waiting for this one to resign).
    fn clear_stats(&self, mine: &Arc<AssignerStats>) {
        self.stats.send_if_modified(|stats| {
            let ours = stats.as_ref().is_some_and(|s| Arc::ptr_eq(s, mine));
            if ours {
                *stats = None;
            }
            ours
        });
        self.changed();
    }

    /// Wakes the control task: what its status shows of this Assigner changed.
    fn changed(&self) {
        self.shared.changed.notify_one();
    }
}

/// Parts for the fleet's tests: `store`, a Distributor and a book of their own, nothing
/// else.
#[cfg(test)]
pub(super) fn test_shared(store: Arc<dyn AssignmentStore>) -> Shared {
    Shared {
        instance: "solo".into(),
        store,
        distributor: Distributor::new(),
        book: LoadBook::new(),
        registries: Registries::default(),
        events: super::Events(Arc::new(|_| {})),
        given_tasks: Arc::default(),
        tune: None,
        endpoint_names: None,
        changed: Arc::new(Notify::new()),
    }
}

#[cfg(test)]
mod tests {
    use steady_slicer::MemoryStore;

    use super::*;

    /// Once a job is removed, its follower publishes nothing more, not even a generation
    /// it has in hand (an abort lands only at the follower's next await: a removal used
    /// to race a publication, which put the job back in the Distributor and the book).
    #[tokio::test]
    async fn a_removed_job_s_follower_publishes_nothing_more() {
        let store = Arc::new(MemoryStore::new());
        let shared = test_shared(store.clone());
        let (_stats, leading_here) = watch::channel(None);
        let removed = Gate::default();
        let follower =
            tokio::spawn(follow_store("users".into(), shared.clone(), leading_here, removed.clone()));
        let leader = store.campaign("users", "solo").await.unwrap();
        let empty = store.read("users").await.unwrap();
        let first = store.write(&leader, &empty, &Assignment::single(1, vec![0]).unwrap()).await.unwrap();
        steady_testing::wait::eventually("the first generation in the Distributor", || {
            shared.distributor.current("users").is_some()
        })
        .await;
        // Removed as `Job::remove` does, but the follower not aborted: only the gate stops it.
        removed.close();
        shared.book.forget("users");
        assert!(shared.distributor.retire("users"));
        store.write(&leader, &first, &Assignment::single(2, vec![0]).unwrap()).await.unwrap();
        steady_testing::wait::eventually("the follower to end on the next generation", || {
            follower.is_finished()
        })
        .await;
        assert!(shared.distributor.current("users").is_none(), "the removed job came back");
        let probe = steady_proto::autosharding::ranges::RangeRates {
            ranges: Vec::new(),
            interval: Duration::from_secs(1),
        };
        let kept = shared.book.accept_client("users", "probe", probe);
        assert_eq!(
            kept,
            Err(steady_slicer::load::Dropped::UnknownJob),
            "the book knows the removed job again"
        );
    }

    /// A job handed over and back twice in quick succession on one instance (the spread
    /// moving as jobs are added): the Assigner that leads at the end keeps its leader key.
    /// The second Assigner, stopped while it waited for the first, used to end at once,
    /// so the third started before the first's late-win release, which then deleted the
    /// third's key (on the same session lease) while it led: the job stayed unled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handed_over_and_back_twice_the_last_assigner_keeps_its_key() {
        use steady_slicer::fleet::EtcdFleet;
        use steady_slicer::specs::TaskSource;
        use steady_slicer::store::{EtcdConfig, EtcdStore};

        let Some(etcd) = steady_testing::Etcd::start() else { return };
        let config = EtcdConfig::new([etcd.endpoint()]).lease_ttl(Duration::from_secs(5)).session_lease(true);
        let store = EtcdStore::connect(config).await.unwrap();
        let fleet = EtcdFleet::new(&store);
        let shared = test_shared(Arc::new(store));
        let mut job = Job::follow(JobConfig::new("users", TaskSource::Count(3)), &shared, None);
        let leads = |job: &Job| job.stats().is_some_and(|s| s.is_leading());
        job.lead(&shared);
        steady_testing::wait::eventually("the first Assigner to lead", || leads(&job)).await;
        let first = job.stats().unwrap();
        // Away and back, twice, at once.
        for _ in 0..2 {
            assert!(job.hand_over());
            job.lead(&shared);
        }
        // The job's statistics are the first Assigner's until it has stopped: wait for
        // another's (the second never starts a service: it is stopped while it waits).
        let last = |job: &Job| job.stats().filter(|s| !Arc::ptr_eq(s, &first));
        steady_testing::wait::eventually("the last Assigner to lead", || {
            last(&job).is_some_and(|s| s.is_leading())
        })
        .await;
        assert_eq!(fleet.leader("users").await.unwrap().as_deref(), Some("solo"));
        // Every earlier Assigner's late-win release comes within LATE_WIN of its stop:
        // the key is still the leader's past that.
        tokio::time::sleep(LATE_WIN * 2).await;
        assert!(leads(&job), "the last Assigner still leads");
        assert_eq!(
            fleet.leader("users").await.unwrap().as_deref(),
            Some("solo"),
            "its leader key was deleted"
        );
    }
}
