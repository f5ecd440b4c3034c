//! Graph validation, scopes and joins (run once the graph is known to be acyclic): what each
//! predicate and sticky key may read, that the inputs of an exclusive join come from mutually
//! exclusive branches, and how a node's inputs are assembled. The ancestor search here keeps
//! these checks near linear on crafted graphs.

use std::collections::HashMap;

use crate::graph::errors::{Location, ValidationError};
use crate::graph::proto::{CallStyle, EdgeMode, JoinMode, node};
use crate::graph::{options, pointer, predicate};

use super::structure::Adjacency;
use super::{Checker, JOIN_CHECK_STEPS_PER_ITEM, Link, NONE};

impl<'g, 'e> Checker<'g, 'e> {
    /// Predicate paths and sticky keys may only read the ingress and finished ancestors.
    pub(super) fn check_scopes(&mut self, order: &[u32]) {
        let graph = self.graph;
        let mut position = vec![0u32; graph.nodes.len()];
        for (pos, &node) in order.iter().enumerate() {
            position[node as usize] = pos as u32;
        }
        let mut search = AncestorSearch::new(graph.nodes.len());
        let mut found = Vec::new();
        for (index, edge) in graph.edges.iter().enumerate() {
            let (Some(when), Some(link)) = (&edge.when, self.links[index]) else {
                continue;
            };
            let (_, scoped) = predicate::check(when);
            for path in scoped {
                let Some(root) = pointer::first_segment(path.path) else {
                    continue;
                };
                if !self.in_scope(&root, link.source, &position, &mut search) {
                    found.push(ValidationError::PredicateScope {
                        location: Location::Edge(self.edge_ref(index)),
                        field: if path.at.is_empty() {
                            "when".into()
                        } else {
                            format!("when.{}", path.at)
                        },
                        root: root.into_owned(),
                        node: self.node_name(link.source).to_string(),
                    });
                }
            }
        }
        for (index, node) in graph.nodes.iter().enumerate() {
            let Some(node::Kind::Split(split)) = &node.kind else {
                continue;
            };
            if pointer::check(&split.sticky_key).is_err() {
                continue;
            }
            if let Some(root) = pointer::first_segment(&split.sticky_key)
                && !self.in_scope(&root, index as u32, &position, &mut search)
            {
                found.push(ValidationError::PredicateScope {
                    location: Location::Node(node.name.clone()),
                    field: "split.sticky_key".into(),
                    root: root.into_owned(),
                    node: node.name.clone(),
                });
            }
        }
        self.errors.extend(found);
    }

    pub(super) fn in_scope(
        &self,
        root: &str,
        node: u32,
        position: &[u32],
        search: &mut AncestorSearch,
    ) -> bool {
        match self.names.get(root).copied() {
            None => false,
            Some(r) if r == self.ingress || r == node => true,
            Some(r) => search.is_ancestor(r, node, position, &self.in_edges, &self.links),
        }
    }

    /// A join-ALL node whose required in-edges lie on different branches of one switch or
    /// split can never run (KServe/Seldon users met this as hanging requests). Found with the
    /// dominator tree of the graph in which every edge is also a vertex: a branch edge
    /// dominating an in-edge means that in-edge is live only when that branch is chosen.
    pub(super) fn check_exclusive_joins(&mut self, order: &[u32], reachable: &[bool]) {
        let graph = self.graph;
        let has_router = graph
            .nodes
            .iter()
            .any(|n| matches!(n.kind, Some(node::Kind::Switch(_) | node::Kind::Split(_))));
        if !has_router || self.ingress == NONE {
            return;
        }
        let n = graph.nodes.len();
        let total = n + graph.edges.len();
        // Vertex v < n is node v; vertex n + e is edge e.
        let mut idom = vec![NONE; total];
        let mut rank = vec![0u32; total];
        // Nearest dominating branch-edge vertex (itself included), or NONE.
        let mut nearest_branch = vec![NONE; total];
        let is_router = |node: u32| {
            matches!(
                graph.nodes[node as usize].kind,
                Some(node::Kind::Switch(_) | node::Kind::Split(_))
            )
        };
        let ingress = self.ingress;
        idom[ingress as usize] = ingress;
        let mut next_rank = 1u32;
        // Both walks below climb the dominator tree, which a crafted graph can make long for
        // many nodes (a long chain with edges from each of its nodes into one join): a work
        // budget keeps the check linear, and a graph that exceeds it is refused by name.
        let budget = JOIN_CHECK_STEPS_PER_ITEM.saturating_mul(total as u64);
        let mut steps = 0u64;
        let intersect = |mut a: u32, mut b: u32, idom: &[u32], rank: &[u32], steps: &mut u64| {
            while a != b {
                while rank[a as usize] > rank[b as usize] {
                    a = idom[a as usize];
                    *steps += 1;
                }
                while rank[b as usize] > rank[a as usize] {
                    b = idom[b as usize];
                    *steps += 1;
                }
            }
            a
        };
        for &node in order {
            if node == ingress || !reachable[node as usize] {
                continue;
            }
            let mut dominator = NONE;
            for &edge in self.in_edges.of(node) {
                let source = self.source_of(edge);
                if !reachable[source as usize] {
                    continue;
                }
                let vertex = n as u32 + edge;
                idom[vertex as usize] = source;
                rank[vertex as usize] = next_rank;
                next_rank += 1;
                nearest_branch[vertex as usize] = if is_router(source) {
                    vertex
                } else {
                    nearest_branch[source as usize]
                };
                dominator = if dominator == NONE {
                    vertex
                } else {
                    intersect(dominator, vertex, &idom, &rank, &mut steps)
                };
                if steps > budget {
                    self.push(ValidationError::TooComplex {
                        check: "joins across switch and split branches",
                    });
                    return;
                }
            }
            if dominator == NONE {
                continue;
            }
            idom[node as usize] = dominator;
            rank[node as usize] = next_rank;
            next_rank += 1;
            nearest_branch[node as usize] = nearest_branch[dominator as usize];
        }

        let mut found = Vec::new();
        let mut chosen: HashMap<u32, (u32, u32)> = HashMap::new();
        let mut required: Vec<u32> = Vec::new();
        for &node in order {
            let target = &graph.nodes[node as usize];
            if !reachable[node as usize] || target.join != JoinMode::All as i32 {
                continue;
            }
            if self.in_edges.of(node).len() < 2 {
                continue;
            }
            required.clear();
            required.extend(self.in_edges.of(node).iter().copied().filter(|&e| {
                !graph.edges[e as usize].optional && reachable[self.source_of(e) as usize]
            }));
            if required.len() < 2 {
                continue;
            }
            chosen.clear();
            'edges: for &edge in &required {
                let mut branch = nearest_branch[n + edge as usize];
                while branch != NONE {
                    steps += 1;
                    if steps > budget {
                        self.errors.extend(found);
                        self.push(ValidationError::TooComplex {
                            check: "joins across switch and split branches",
                        });
                        return;
                    }
                    let router = idom[branch as usize];
                    match chosen.get(&router) {
                        Some(&(vertex, _)) if vertex == branch => break,
                        Some(&(_, other_edge)) => {
                            found.push(ValidationError::ExclusiveJoin {
                                node: target.name.clone(),
                                first: self.edge_ref(other_edge as usize),
                                second: self.edge_ref(edge as usize),
                                branch: self.node_name(router).to_string(),
                                branch_kind: if matches!(
                                    self.node_kind(router),
                                    Some(node::Kind::Split(_))
                                ) {
                                    "split"
                                } else {
                                    "switch"
                                },
                            });
                            break 'edges;
                        }
                        None => {
                            chosen.insert(router, (branch, edge));
                        }
                    }
                    branch = nearest_branch[router as usize];
                }
            }
        }
        self.errors.extend(found);
    }

    /// How in-edges build each node's input: no two writes at overlapping pointers into a
    /// join-ALL node, and keyword-argument names for KWARGS models.
    pub(super) fn check_inputs_assembly(&mut self) {
        let graph = self.graph;
        let mut found = Vec::new();
        // Reused buffers: no allocation per node.
        let mut data_edges: Vec<u32> = Vec::new();
        let mut writes: Vec<(&str, u32)> = Vec::new();
        for (index, node) in graph.nodes.iter().enumerate() {
            let is_kwargs_model = matches!(&node.kind, Some(node::Kind::Model(m)) if m.call_style == CallStyle::Kwargs as i32);
            let in_edges = self.in_edges.of(index as u32);
            if in_edges.len() < 2 && !is_kwargs_model {
                continue;
            }
            data_edges.clear();
            data_edges.extend(
                in_edges
                    .iter()
                    .copied()
                    .filter(|&e| graph.edges[e as usize].mode == EdgeMode::Data as i32),
            );
            if let Some(node::Kind::Model(model)) = &node.kind
                && model.call_style == CallStyle::Kwargs as i32
            {
                for &e in &data_edges {
                    let into = &graph.edges[e as usize].into;
                    if pointer::check(into).is_err() {
                        continue;
                    }
                    if let Some(key) = pointer::first_segment(into)
                        && !options::is_python_identifier(&key)
                    {
                        found.push(ValidationError::KwargsKey {
                            edge: self.edge_ref(e as usize),
                            node: node.name.clone(),
                            key: key.into_owned(),
                        });
                    }
                }
            }
            if node.join != JoinMode::All as i32 || data_edges.len() < 2 {
                continue;
            }
            // Tensor edges all append to `/inputs`; they conflict only with other writers.
            writes.clear();
            let mut tensors_edge = None;
            for &e in &data_edges {
                let edge = &graph.edges[e as usize];
                if pointer::check(&edge.into).is_err() {
                    continue;
                }
                if edge.tensors.is_some() {
                    tensors_edge.get_or_insert(e);
                } else {
                    writes.push((edge.into.as_str(), e));
                }
            }
            if let Some(e) = tensors_edge {
                writes.push(("/inputs", e));
            }
            // Sorted by segments, any overlapping pair has an overlapping neighbour.
            writes.sort_by(|a, b| {
                pointer::segments(a.0)
                    .cmp(pointer::segments(b.0))
                    .then(a.1.cmp(&b.1))
            });
            for pair in writes.windows(2) {
                let ((first_into, first), (second_into, second)) = (pair[0], pair[1]);
                if pointer::overlaps(first_into, second_into) {
                    let (first, second, first_into, second_into) = if first < second {
                        (first, second, first_into, second_into)
                    } else {
                        (second, first, second_into, first_into)
                    };
                    found.push(ValidationError::IntoConflict {
                        node: node.name.clone(),
                        first: self.edge_ref(first as usize),
                        second: self.edge_ref(second as usize),
                        first_into: first_into.to_string(),
                        second_into: second_into.to_string(),
                    });
                }
            }
        }
        self.errors.extend(found);
    }
}

/// Backward search from a node for a candidate ancestor, pruned by topological position (a
/// node placed before the candidate cannot have it as an ancestor). Visit marks are stamped
/// with a generation, so repeated queries allocate nothing.
pub(super) struct AncestorSearch {
    stamp: Vec<u32>,
    generation: u32,
    stack: Vec<u32>,
}

impl AncestorSearch {
    pub(super) fn new(n: usize) -> Self {
        AncestorSearch {
            stamp: vec![0; n],
            generation: 0,
            stack: Vec::new(),
        }
    }

    pub(super) fn is_ancestor(
        &mut self,
        candidate: u32,
        node: u32,
        position: &[u32],
        in_edges: &Adjacency,
        links: &[Option<Link>],
    ) -> bool {
        if position[candidate as usize] >= position[node as usize] {
            return false;
        }
        self.generation += 1;
        self.stack.clear();
        self.stack.push(node);
        while let Some(current) = self.stack.pop() {
            for &edge in in_edges.of(current) {
                let Some(link) = links[edge as usize] else {
                    continue;
                };
                let source = link.source;
                if source == candidate {
                    return true;
                }
                let s = source as usize;
                if self.stamp[s] != self.generation && position[s] > position[candidate as usize] {
                    self.stamp[s] = self.generation;
                    self.stack.push(source);
                }
            }
        }
        false
    }
}
