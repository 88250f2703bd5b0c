//! The keyed half of the routing table: for each slice of the assignment in force,
//! the replicas this frontend uses and which of them are ready.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use steady_slice::{Assignment, SliceKey};
use steady_subset::prng::SplitMix64;
use steady_subset::{Ringsteady, Subsetting};

use super::endpoint::Endpoint;
use super::load_bound::LoadBound;
use super::pick::p2c;

/// The replicas of slice `i` this frontend uses: all of them when there are at most
/// `fan_out`, otherwise its own Ringsteady subset of the replica list (so that many
/// frontends spread a hot slice's load evenly over all its replicas).
pub(crate) fn chosen_replicas(replicas: &[u32], frontend: usize, fan_out: usize) -> Vec<u32> {
    if replicas.len() <= fan_out {
        return replicas.to_vec();
    }
    Ringsteady::new()
        .subset(frontend, replicas.len(), fan_out)
        .expect("replica lists are far below MAX_BACKENDS")
        .into_iter()
        .map(|i| replicas[i])
        .collect()
}

/// How a zone-aware frontend's keyed requests prefer its zone.
pub(crate) struct ZonePreference<'a> {
    /// Whether a task is in the frontend's zone.
    pub(crate) is_local: &'a dyn Fn(u32) -> bool,
    /// The zone's share of the frontend job: its share of every slice's requests.
    pub(crate) demand_share: f64,
    /// The frontend's index in the whole frontend job, for choosing among other zones'
    /// replicas (the frontend's own index is its zone index).
    pub(crate) job_index: usize,
}

/// The replicas of one slice as this frontend uses them.
#[derive(Debug, PartialEq)]
struct Choice {
    /// The replicas it asks connections for.
    asked: Vec<u32>,
    /// The replicas requests go to first, and their share of the requests (`keep`)...
    first: Vec<u32>,
    keep: f64,
    /// ...and the rest (`1 - keep` of the requests, and every request when none of
    /// `first` is ready; and a request refused by one of `first` may move here).
    rest: Vec<u32>,
}

/// The replicas of a slice this frontend uses. Without a zone preference:
/// [`chosen_replicas`], all first. With one, while some chosen replica in the
/// frontend's zone is `usable` (connected, or may become so): the zone's chosen replicas
/// first, keeping as many of the slice's requests as the zone's share of the slice's
/// usable replicas covers of its share of the demand (Envoy's rule, as for unkeyed
/// requests); the other zones' chosen replicas take the rest, and are asked for only
/// when some requests go there. Without a usable local replica: all replicas, as without
/// zones (chosen by the frontend's index in the whole job).
fn choose(
    replicas: &[u32],
    frontend: usize,
    fan_out: usize,
    preference: Option<&ZonePreference<'_>>,
    usable: impl Fn(u32) -> bool,
) -> Choice {
    let whole = |frontend| {
        let chosen = chosen_replicas(replicas, frontend, fan_out);
        Choice { asked: chosen.clone(), first: chosen, keep: 1.0, rest: Vec::new() }
    };
    let Some(preference) = preference else { return whole(frontend) };
    let (local, remote): (Vec<u32>, Vec<u32>) = replicas.iter().partition(|&&t| (preference.is_local)(t));
    let first = chosen_replicas(&local, frontend, fan_out);
    if !first.iter().any(|&t| usable(t)) {
        return whole(preference.job_index);
    }
    let usable_local = local.iter().filter(|&&t| usable(t)).count() as f64;
    let usable_remote = remote.iter().filter(|&&t| usable(t)).count() as f64;
    let capacity_share = usable_local / (usable_local + usable_remote);
    let keep =
        if preference.demand_share > 0.0 { (capacity_share / preference.demand_share).min(1.0) } else { 1.0 };
    let rest = chosen_replicas(&remote, preference.job_index, fan_out);
    let mut asked = first.clone();
    if keep < 1.0 {
        asked.extend(&rest);
    }
    Choice { asked, first, keep, rest }
}

/// Slice starts, and per slice the chosen replicas and the ready ones, laid out flat.
///
/// Lookup uses a radix index on the key's top bits: `first[b]` is the slice holding the
/// first key of bucket `b`, so the slice of any key in the bucket lies between
/// `first[b]` and `first[b + 1]`, usually one or two slices apart; a binary search
/// settles the rest. With about two buckets per slice, a lookup reads two small arrays.
#[derive(Debug)]
pub(crate) struct SliceTable<S> {
    pub(crate) generation: u64,
    starts: Vec<u64>,
    /// `64 - bits` of the radix index.
    shift: u32,
    /// `first[b]`: the slice holding key `b << shift`; one extra entry at the end.
    first: Vec<u32>,
    /// `chosen[chosen_at[i]..chosen_at[i + 1]]`: slice i's chosen replicas.
    chosen: Vec<u32>,
    chosen_at: Vec<u32>,
    /// `ready[ready_at[i]..ready_at[i + 1]]`: the connected ones among them (for a
    /// zone-aware frontend, those its requests go to first, then the others: see
    /// [`ZonedSlices`]).
    ready: Vec<Arc<Endpoint<S>>>,
    ready_at: Vec<u32>,
    /// Per slice: whether some chosen replica is not connected.
    missing: Vec<bool>,
    /// Per slice: whether this table already asked for its missing replicas.
    asked: Vec<AtomicBool>,
    /// Per slice: whether some chosen replica is ready or can become so (its task serves
    /// and is connecting, or can be connected). A keyed request for a slice without one
    /// follows the no-replica policy at once instead of waiting for what cannot come.
    servable: Vec<bool>,
    /// For a zone-aware frontend: how each slice's ready replicas divide between its
    /// zone's and the others'. `None` without zones: every ready replica alike.
    zones: Option<ZonedSlices>,
    /// Bounded-load routing, when configured: where a request goes whose pick has far
    /// more in flight than the mean (see [`LoadBound`]).
    bound: Option<Box<LoadBound<S>>>,
}

/// How a zone-aware frontend's keyed requests divide between the ready replicas in its
/// zone (the first `first_len[i]` of slice `i`'s ready ones) and the others: a request
/// whose 32-bit draw is below `keep[i]` goes to the first (`u32::MAX`: every request).
#[derive(Debug)]
struct ZonedSlices {
    first_len: Vec<u32>,
    keep: Vec<u32>,
}

impl ZonedSlices {
    /// `share` of the 32-bit draw range; 1 is every request.
    fn threshold(share: f64) -> u32 {
        if share >= 1.0 {
            u32::MAX
        } else {
            (share.max(0.0) * 4_294_967_296.0) as u32
        }
    }

    /// Slice `i`'s pick among its `ready` replicas: the first ones for `keep[i]` of the
    /// requests, the others for the rest, either when the other has none usable.
    #[inline(never)]
    fn pick<'a, S>(
        &self,
        i: usize,
        ready: &'a [Arc<Endpoint<S>>],
        rng: &mut SplitMix64,
    ) -> Option<&'a Arc<Endpoint<S>>> {
        let (first, rest) = ready.split_at((self.first_len[i] as usize).min(ready.len()));
        let keep = self.keep[i];
        let (pool, other) = if keep == u32::MAX || ((rng.next() >> 32) as u32) < keep {
            (first, rest)
        } else {
            (rest, first)
        };
        p2c(pool, rng).or_else(|| p2c(other, rng))
    }
}

impl<S> SliceTable<S> {
    /// Builds the table for `assignment` from the endpoints connected now; `reachable`
    /// says whether a task not connected may become so (see [`SliceTable::servable`]);
    /// `preference`, for a zone-aware frontend, how its keyed requests prefer its zone
    /// (see [`choose`]); `bound`, bounded-load routing over the connected replicas.
    pub(crate) fn build(
        assignment: &Assignment,
        frontend: usize,
        fan_out: usize,
        connected: &HashMap<usize, Arc<Endpoint<S>>>,
        reachable: &dyn Fn(u32) -> bool,
        preference: Option<&ZonePreference<'_>>,
        bound: Option<(crate::config::KeyedLoadBound, Arc<std::sync::atomic::AtomicU64>)>,
    ) -> Self {
        let n = assignment.slices().len();
        let mut table = Self {
            generation: assignment.generation(),
            starts: Vec::with_capacity(n),
            shift: 64,
            first: Vec::new(),
            chosen: Vec::new(),
            chosen_at: Vec::with_capacity(n + 1),
            ready: Vec::new(),
            ready_at: Vec::with_capacity(n + 1),
            missing: Vec::with_capacity(n),
            asked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            servable: Vec::with_capacity(n),
            zones: preference
                .map(|_| ZonedSlices { first_len: Vec::with_capacity(n), keep: Vec::with_capacity(n) }),
            bound: None,
        };
        table.chosen_at.push(0);
        table.ready_at.push(0);
        let endpoint = |t: u32| connected.get(&(t as usize));
        let usable = |t: u32| endpoint(t).is_some() || reachable(t);
        for slice in assignment.slices() {
            table.starts.push(slice.start.get());
            let choice = choose(slice.replicas(), frontend, fan_out.max(1), preference, usable);
            table.chosen.extend(&choice.asked);
            table.missing.push(choice.asked.iter().any(|&t| endpoint(t).is_none()));
            let start = table.ready.len();
            table.ready.extend(choice.first.iter().filter_map(|&t| endpoint(t).cloned()));
            let first_len = table.ready.len() - start;
            table.ready.extend(choice.rest.iter().filter_map(|&t| endpoint(t).cloned()));
            table.servable.push(table.ready.len() > start || choice.asked.iter().any(|&t| reachable(t)));
            if let Some(zones) = &mut table.zones {
                zones.first_len.push(first_len as u32);
                zones.keep.push(ZonedSlices::threshold(choice.keep));
            }
            table.chosen_at.push(table.chosen.len() as u32);
            table.ready_at.push(table.ready.len() as u32);
        }
        table.build_index();
        if let Some((config, spilled)) = bound {
            // The connected replicas, each once: what the mean is over and where spills
            // may go (never a task the assignment does not name, such as one draining
            // out of it).
            let mut seen = std::collections::HashSet::new();
            let pool = table.ready.iter().filter(|e| seen.insert(e.id)).cloned().collect();
            table.bound = Some(Box::new(LoadBound::new(config, pool, spilled)));
        }
        table
    }

    /// Builds the radix index: about two buckets per slice, at most 2^20.
    fn build_index(&mut self) {
        let bits = (usize::BITS - self.starts.len().leading_zeros() + 1).clamp(1, 20);
        self.shift = 64 - bits;
        let buckets = 1usize << bits;
        self.first = Vec::with_capacity(buckets + 1);
        let mut slice = 0usize;
        for b in 0..buckets {
            let key = (b as u64) << self.shift;
            while slice + 1 < self.starts.len() && self.starts[slice + 1] <= key {
                slice += 1;
            }
            self.first.push(slice as u32);
        }
        // Past the last bucket: the last slice.
        self.first.push((self.starts.len() - 1) as u32);
    }

    /// The slice holding `key`.
    #[inline]
    pub(crate) fn index(&self, key: SliceKey) -> usize {
        let key = key.get();
        let b = (key >> self.shift) as usize;
        let (lo, hi) = (self.first[b] as usize, self.first[b + 1] as usize);
        // The answer is in lo..=hi: the last start <= key among them.
        lo + self.starts[lo + 1..=hi].partition_point(|&s| s <= key)
    }

    /// Slice `i`'s chosen replicas.
    pub(crate) fn chosen(&self, i: usize) -> &[u32] {
        &self.chosen[self.chosen_at[i] as usize..self.chosen_at[i + 1] as usize]
    }

    /// Slice `i`'s ready replicas.
    #[inline]
    pub(crate) fn ready(&self, i: usize) -> &[Arc<Endpoint<S>>] {
        &self.ready[self.ready_at[i] as usize..self.ready_at[i + 1] as usize]
    }

    /// Whether some of slice `i`'s chosen replicas is ready or may become so: when not,
    /// waiting for one is in vain.
    #[inline]
    pub(crate) fn servable(&self, i: usize) -> bool {
        self.servable[i]
    }

    /// Whether some of slice `i`'s chosen replicas are not connected and nobody has
    /// asked for them yet under this table (true at most once per slice and table).
    #[inline]
    pub(crate) fn wants_more_replicas(&self, i: usize) -> bool {
        self.missing[i]
            && !self.asked[i].load(Ordering::Relaxed)
            && !self.asked[i].swap(true, Ordering::Relaxed)
    }

    /// Power of two choices among slice `i`'s ready replicas (for a zone-aware
    /// frontend, among its zone's or the others', as [`ZonedSlices`] divides them);
    /// with a load bound, a pick over it moves to the next candidate (see [`LoadBound`]).
    #[inline]
    pub(crate) fn pick(&self, i: usize, rng: &mut SplitMix64) -> Option<&Arc<Endpoint<S>>> {
        let ready = self.ready(i);
        let picked = match &self.zones {
            None => p2c(ready, rng),
            Some(zones) => zones.pick(i, ready, rng),
        };
        match (&self.bound, picked) {
            (Some(bound), Some(e)) if bound.may_be_over(e) => {
                Some(bound.place(e, i, self.starts.len(), |j| self.ready(j), rng))
            }
            _ => picked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_slice_is_spread_evenly_over_its_replicas() {
        // 20 replicas, fan-out 3, 200 frontends: each replica chosen about 30 times.
        let replicas: Vec<u32> = (100..120).collect();
        let mut count: HashMap<u32, usize> = HashMap::new();
        for m in 0..200 {
            let chosen = chosen_replicas(&replicas, m, 3);
            assert_eq!(chosen.len(), 3);
            for t in chosen {
                *count.entry(t).or_default() += 1;
            }
        }
        assert_eq!(count.len(), 20);
        let (lo, hi) = (count.values().min().unwrap(), count.values().max().unwrap());
        assert!(*lo >= 27 && *hi <= 33, "{count:?}");
    }

    #[test]
    fn radix_lookup_agrees_with_a_binary_search_of_every_start() {
        use steady_slice::Slice;
        let mut rng = SplitMix64::new(3);
        for slices in [1usize, 2, 3, 17, 1000] {
            for clustered in [false, true] {
                // Random starts, or many crowded into one small range (a hot spot).
                let mut starts: Vec<u64> = (1..slices)
                    .map(|_| if clustered { (1 << 40) + rng.below(5000) } else { rng.next() })
                    .collect();
                starts.push(0);
                starts.sort_unstable();
                starts.dedup();
                let a =
                    Assignment::new(1, starts.iter().map(|&s| Slice::new(SliceKey(s), vec![0])).collect())
                        .unwrap();
                let t = SliceTable::<()>::build(&a, 0, 3, &HashMap::new(), &|_| true, None, None);
                // Every start and its neighbours, every bucket edge, random keys.
                let edges: Vec<u64> = (0..t.first.len() as u64 - 1)
                    .flat_map(|b| {
                        let edge = b << t.shift;
                        [edge, edge.saturating_sub(1)]
                    })
                    .collect();
                let probes = starts
                    .iter()
                    .flat_map(|&s| [s, s.saturating_sub(1), s.saturating_add(1)])
                    .chain(edges)
                    .chain((0..2000).map(|_| rng.next()))
                    .chain([0, u64::MAX, 1 << 40]);
                for key in probes {
                    assert_eq!(t.index(SliceKey(key)), a.slice_index(SliceKey(key)), "key {key}");
                }
            }
        }
    }

    #[test]
    fn a_zone_aware_frontend_prefers_its_zone_s_replicas_as_far_as_they_cover_its_demand() {
        // The odd tasks are local: replicas 1 and 3; 2, 4 and 6 are not.
        let is_local = |t: u32| t % 2 == 1;
        let preference = |demand_share| ZonePreference { is_local: &is_local, demand_share, job_index: 7 };
        let replicas = [2, 1, 3, 4, 6];
        // Demand a third: the zone's 2 of 5 replicas cover it; nothing is asked elsewhere,
        // but the others stay behind for a refused request.
        let c = choose(&replicas, 0, 3, Some(&preference(1.0 / 3.0)), |_| true);
        assert_eq!((c.asked.clone(), c.first.clone(), c.keep), (vec![1, 3], vec![1, 3], 1.0));
        assert_eq!(c.rest, chosen_replicas(&[2, 4, 6], 7, 3));
        // Demand a half: 2/5 of the replicas keep 80% of the requests, the rest go out.
        let c = choose(&replicas, 0, 3, Some(&preference(0.5)), |_| true);
        assert!((c.keep - 0.8).abs() < 1e-12, "{c:?}");
        assert_eq!(c.asked, [1, 3, 2, 4, 6]);
        // No local replica usable: all of them, as without zones, by the job index.
        let c = choose(&replicas, 0, 3, Some(&preference(0.5)), |t| !is_local(t));
        assert_eq!((c.first, c.keep), (chosen_replicas(&replicas, 7, 3), 1.0));
        // Without zones: today's choice.
        assert_eq!(choose(&replicas, 0, 3, None, |_| true).first, chosen_replicas(&replicas, 0, 3));
    }

    #[test]
    fn keyed_requests_divide_between_the_zone_and_the_others_by_the_kept_share() {
        let endpoints: HashMap<usize, Arc<Endpoint<()>>> =
            (0..4).map(|t| (t, Arc::new(Endpoint::detached(t, t as u64, ())))).collect();
        let is_local = |t: u32| t == 0;
        // One replica per zone of four, demand a half: the zone keeps half its requests.
        let preference = ZonePreference { is_local: &is_local, demand_share: 0.5, job_index: 0 };
        let a = Assignment::new(1, vec![steady_slice::Slice::new(SliceKey(0), vec![0, 1, 2, 3])]).unwrap();
        let t = SliceTable::build(&a, 0, 4, &endpoints, &|_| true, Some(&preference), None);
        let mut rng = SplitMix64::new(9);
        let local = (0..20_000).filter(|_| t.pick(0, &mut rng).unwrap().task == 0).count();
        assert!((local as f64 / 20_000.0 - 0.5).abs() < 0.02, "{local}");
    }

    #[test]
    fn small_replica_lists_are_used_whole() {
        assert_eq!(chosen_replicas(&[4, 2], 9, 3), [4, 2]);
    }
}
