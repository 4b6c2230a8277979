//! What the replicas of a fleet tell each other about an upstream, and one replica's share
//! of what they learned.

/// What one replica publishes to the others about an upstream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetReport {
    /// The rate this replica learned the upstream accepts, once it has seen congestion.
    pub learned_rate: Option<f64>,
    /// Requests per second arriving at this replica for the upstream (sent or refused).
    pub demand: f64,
}

/// This replica's share of what the fleet learned: the sum of the replicas' learned rates,
/// split in proportion to their demand (at least 1 req/s each, so an idle replica keeps a
/// foothold). `None` when no replica has learned a rate yet.
pub fn fleet_share(mine: &FleetReport, fleet: &[FleetReport]) -> Option<f64> {
    let learned: f64 = fleet.iter().filter_map(|r| r.learned_rate).sum();
    if fleet.iter().all(|r| r.learned_rate.is_none()) {
        return None;
    }
    let weight = |r: &FleetReport| r.demand.max(1.0);
    let total: f64 = fleet.iter().map(weight).sum();
    Some(learned * weight(mine) / total.max(weight(mine)))
}
