//! Requests no node of the fleet could ever serve, whatever its state: refused at once
//! instead of filling the holding queue (issue 10, item 7).

use super::types::{FleetView, RouteRequest};

/// The required tags no single node carries together; None when some node has them all
/// (whether it is up now or not).
pub fn unservable_tags(req: &RouteRequest, fleet: &FleetView) -> Option<Vec<String>> {
    if req.required_tags.is_empty() {
        return None;
    }
    let some_node_has_all = fleet
        .nodes
        .iter()
        .any(|n| req.required_tags.iter().all(|t| n.tags.contains(t)));
    if some_node_has_all {
        return None;
    }
    let missing = req
        .required_tags
        .iter()
        .filter(|t| !fleet.nodes.iter().any(|n| n.tags.contains(t)))
        .cloned()
        .collect::<Vec<_>>();
    Some(if missing.is_empty() {
        req.required_tags.clone()
    } else {
        missing
    })
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{fleet, node};
    use super::*;

    fn req(tags: &[&str]) -> RouteRequest {
        RouteRequest {
            required_tags: tags.iter().map(|t| t.to_string()).collect(),
            ..RouteRequest::default()
        }
    }

    #[test]
    fn tags_no_node_has_are_named() {
        let mut a = node("a", vec![]);
        a.tags = vec!["gpu".into()];
        let mut b = node("b", vec![]);
        b.tags = vec!["vision".into()];
        let f = fleet(vec![a, b]);
        assert_eq!(unservable_tags(&req(&[]), &f), None);
        assert_eq!(unservable_tags(&req(&["gpu"]), &f), None);
        assert_eq!(
            unservable_tags(&req(&["gpu", "nvme"]), &f),
            Some(vec!["nvme".to_string()])
        );
        // Each tag exists, but on different nodes: no node has both.
        assert_eq!(
            unservable_tags(&req(&["gpu", "vision"]), &f),
            Some(vec!["gpu".to_string(), "vision".to_string()])
        );
    }

    #[test]
    fn an_offline_node_still_counts() {
        let mut a = node("a", vec![]);
        a.tags = vec!["gpu".into()];
        a.health = crate::routing::Health::Offline;
        assert_eq!(unservable_tags(&req(&["gpu"]), &fleet(vec![a])), None);
    }
}
