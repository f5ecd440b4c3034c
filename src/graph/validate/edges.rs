//! Graph validation, edges: resolving each edge's endpoints by name, each edge's own fields and
//! mode against the kinds of node it joins, and the routing nodes (switch, split) against their
//! outgoing edges.

use crate::graph::errors::{EdgeEnd, Location, ValidationError};
use crate::graph::proto::{EdgeMode, NoMatch, node};
use crate::graph::{pointer, predicate};

use super::structure::Adjacency;
use super::{Checker, Link, NONE, json_value_is_finite};

impl<'g, 'e> Checker<'g, 'e> {
    // -- edges -----------------------------------------------------------------------------------

    pub(super) fn resolve_edges(&mut self) {
        let graph = self.graph;
        let n = graph.nodes.len();
        for (index, edge) in graph.edges.iter().enumerate() {
            let source = self.names.get(edge.source.as_str()).copied();
            let target = self.names.get(edge.target.as_str()).copied();
            for (end, name, found) in [
                (EdgeEnd::Source, &edge.source, source),
                (EdgeEnd::Target, &edge.target, target),
            ] {
                if found.is_none() {
                    let edge = self.edge_ref(index);
                    self.push(ValidationError::UnknownNode {
                        edge,
                        end,
                        name: name.clone(),
                    });
                }
            }
            self.links.push(match (source, target) {
                (Some(source), Some(target)) => Some(Link { source, target }),
                _ => None,
            });
        }
        // Parallel edges: grouped by source, a target seen twice is a duplicate (the first
        // declared edge stays). A stamp per target instead of a hash set of pairs.
        let links = std::mem::take(&mut self.links);
        let resolved = || {
            links
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.map(|l| (l, i as u32)))
        };
        let all_out = Adjacency::build(n, resolved().map(|(l, e)| (l.source, e)));
        let mut last_source = vec![NONE; n];
        let mut last_edge = vec![0u32; n];
        let mut is_duplicate = vec![false; graph.edges.len()];
        let mut duplicates = Vec::new();
        for source in 0..n as u32 {
            for &edge in all_out.of(source) {
                let target = links[edge as usize].map_or(0, |l| l.target as usize);
                if last_source[target] == source {
                    is_duplicate[edge as usize] = true;
                    duplicates.push((edge as usize, last_edge[target] as usize));
                } else {
                    last_source[target] = source;
                    last_edge[target] = edge;
                }
            }
        }
        duplicates.sort_unstable();
        for (index, first_index) in duplicates {
            let edge = self.edge_ref(index);
            self.push(ValidationError::DuplicateEdge { edge, first_index });
        }
        let structural = || resolved().filter(|(_, e)| !is_duplicate[*e as usize]);
        self.out_edges = Adjacency::build(n, structural().map(|(l, e)| (l.source, e)));
        self.in_edges = Adjacency::build(n, structural().map(|(l, e)| (l.target, e)));
        self.links = links;
    }

    pub(super) fn check_edges(&mut self) {
        let graph = self.graph;
        for (index, edge) in graph.edges.iter().enumerate() {
            let edge_ref = || self.edge_ref(index);
            let mut found = Vec::new();
            let invalid = |field: &'static str, problem: &str| ValidationError::InvalidEdgeField {
                edge: edge_ref(),
                field,
                problem: problem.to_string(),
            };
            if EdgeMode::try_from(edge.mode).is_err() {
                found.push(ValidationError::UnknownEnumValue {
                    location: Location::Edge(edge_ref()),
                    field: "mode",
                    value: edge.mode,
                });
            }
            let order_edge = edge.mode == EdgeMode::Order as i32;
            if order_edge {
                if !edge.select.is_empty() {
                    found.push(invalid("select", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
                if edge.tensors.is_some() {
                    found.push(invalid("tensors", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
                if !edge.into.is_empty() {
                    found.push(invalid("into", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
            }
            if !edge.select.is_empty() && edge.tensors.is_some() {
                found.push(invalid(
                    "tensors",
                    "and `select` are both set; choose one way to pick the value",
                ));
            }
            if let Some(tensors) = &edge.tensors {
                if tensors.names.is_empty() || tensors.names.iter().any(String::is_empty) {
                    found.push(invalid(
                        "tensors.names",
                        "must list at least one tensor, each with a non-empty name",
                    ));
                }
                if !edge.into.is_empty() {
                    found.push(invalid("into", "is set together with `tensors`, which always append to the target's `inputs`; remove it"));
                }
            }
            if edge.if_missing.is_some() && !edge.optional {
                found.push(invalid("if_missing", "is set but the edge is not `optional`, so it is never used; add `optional: true` or remove it"));
            }
            for (field, value) in [("select", &edge.select), ("into", &edge.into)] {
                if let Err(problem) = pointer::check(value) {
                    found.push(ValidationError::InvalidPointer {
                        location: Location::Edge(edge_ref()),
                        field,
                        pointer: value.clone(),
                        problem,
                    });
                }
            }
            if let Some(value) = &edge.if_missing
                && !json_value_is_finite(value)
            {
                found.push(ValidationError::InvalidValue {
                    location: Location::Edge(edge_ref()),
                    field: "if_missing".into(),
                });
            }
            if let Some(when) = &edge.when {
                let (problems, _) = predicate::check(when);
                for problem in problems {
                    found.push(ValidationError::InvalidPredicate {
                        edge: edge_ref(),
                        at: problem.at,
                        problem: problem.message,
                    });
                }
            }
            if let Some(link) = self.links[index] {
                let source_kind = self.node_kind(link.source);
                let source_name = self.node_name(link.source).to_string();
                if matches!(self.node_kind(link.target), Some(node::Kind::Input(_))) {
                    found.push(ValidationError::EdgeIntoIngress { edge: edge_ref() });
                }
                if matches!(source_kind, Some(node::Kind::Output(_))) {
                    found.push(ValidationError::EdgeFromOutput { edge: edge_ref() });
                }
                let from_split = matches!(source_kind, Some(node::Kind::Split(_)));
                let from_switch = matches!(source_kind, Some(node::Kind::Switch(_)));
                if edge.weight.is_some() && !from_split {
                    found.push(ValidationError::WeightOutsideSplit {
                        edge: edge_ref(),
                        source_node: source_name.clone(),
                    });
                }
                if edge.order != 0 && !from_switch {
                    found.push(ValidationError::OrderOutsideSwitch {
                        edge: edge_ref(),
                        source_node: source_name.clone(),
                    });
                }
                if from_split && edge.when.is_some() {
                    found.push(ValidationError::GuardOnSplit {
                        edge: edge_ref(),
                        split: source_name.clone(),
                    });
                }
                if from_split && edge.weight.is_none() {
                    found.push(ValidationError::SplitWeightMissing {
                        edge: edge_ref(),
                        split: source_name,
                    });
                }
            }
            self.errors.extend(found);
        }
    }

    /// Switch cases and defaults, split weights: checked on the structural out-edges.
    pub(super) fn check_routing_nodes(&mut self) {
        let graph = self.graph;
        for (index, node) in graph.nodes.iter().enumerate() {
            let out = self.out_edges.of(index as u32);
            match &node.kind {
                Some(node::Kind::Switch(switch)) => {
                    let defaults: Vec<usize> = out
                        .iter()
                        .map(|&e| e as usize)
                        .filter(|&e| graph.edges[e].when.is_none())
                        .collect();
                    if defaults.len() == out.len() {
                        self.push(ValidationError::SwitchWithoutCases {
                            node: node.name.clone(),
                        });
                    }
                    if defaults.len() > 1 {
                        self.push(ValidationError::SwitchMultipleDefaults {
                            node: node.name.clone(),
                            edges: defaults,
                        });
                    } else if defaults.is_empty()
                        && switch.on_no_match == NoMatch::Unspecified as i32
                    {
                        self.push(ValidationError::SwitchWithoutDefault {
                            node: node.name.clone(),
                        });
                    }
                }
                Some(node::Kind::Split(_)) => {
                    let weights: Vec<u32> = out
                        .iter()
                        .filter_map(|&e| graph.edges[e as usize].weight)
                        .collect();
                    // Missing weights are reported per edge; the sum only when all are given.
                    let all_given = weights.len() == out.len();
                    if all_given && weights.iter().map(|&w| u64::from(w)).sum::<u64>() == 0 {
                        self.push(ValidationError::SplitWeightsZero {
                            node: node.name.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
    }
}
