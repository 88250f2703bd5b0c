//! What a running fleet instance shows of itself: [`FleetStatus`], kept current by the
//! fleet's control task and read by the pages.

use std::collections::BTreeMap;
use std::sync::Arc;

use steady_assigner::Tasks;
use steady_slicer::assigner_service::AssignerStats;
use steady_slicer::fleet::Instance;
use steady_slicer::specs::JobConfig;
use tokio::sync::watch;

/// An instance's view of its fleet, replaced whole on each change (a job created,
/// changed or removed; an instance joined or gone; an Assigner started or stopped here).
#[derive(Debug, Clone, Default)]
pub struct FleetStatus {
    /// The live instances by name (only this one on the memory store).
    pub instances: BTreeMap<String, Instance>,
    /// Every job the fleet serves, by name (at most `steady_slicer::specs::MAX_JOBS`).
    pub jobs: BTreeMap<String, JobStatus>,
}

/// One job as an instance sees it.
#[derive(Debug, Clone)]
pub struct JobStatus {
    /// Its spec in force.
    pub config: Arc<JobConfig>,
    /// The instance the spread names to run its Assigner (`None` while no instance is
    /// known alive).
    pub owner: Option<String>,
    /// This instance's Assigner service of the job, while it runs here (whether it leads
    /// yet or still campaigns: [`AssignerStats::is_leading`]).
    pub assigner: Option<Arc<AssignerStats>>,
    /// The task set that Assigner follows (with the spec's drained tasks draining), while
    /// it runs here.
    pub tasks: Option<watch::Receiver<Tasks>>,
}
