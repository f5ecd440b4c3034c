//! Graph validation, structure: the DAG and its deterministic topological order, cycles (each
//! reported with a path through it), reachability from the ingress and to the output, and the
//! compressed per-node edge lists every structure check walks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::graph::{DiGraph, NodeIndex};

use crate::graph::errors::ValidationError;
use crate::graph::proto::node;

use super::{Checker, NONE};

impl<'g, 'e> Checker<'g, 'e> {
    // -- structure -------------------------------------------------------------------------------

    pub(super) fn build_dag(&self) -> DiGraph<(), u32> {
        let mut dag = DiGraph::with_capacity(self.graph.nodes.len(), self.graph.edges.len());
        for _ in 0..self.graph.nodes.len() {
            dag.add_node(());
        }
        // Which edges take part in the structure, marked once: asking `in_edges` per edge
        // would cost O(in-degree) each, quadratic for a node with many in-edges.
        let mut structural = vec![false; self.links.len()];
        for &edge in &self.in_edges.list {
            structural[edge as usize] = true;
        }
        for (index, link) in self.links.iter().enumerate() {
            if let Some(link) = link
                && structural[index]
            {
                dag.add_edge(
                    NodeIndex::new(link.source as usize),
                    NodeIndex::new(link.target as usize),
                    index as u32,
                );
            }
        }
        dag
    }

    /// Kahn's algorithm with the smallest declaration index first among ready nodes.
    pub(super) fn topological_order(&self) -> Result<Vec<u32>, ()> {
        let n = self.graph.nodes.len();
        let mut indegree: Vec<u32> = (0..n as u32)
            .map(|i| self.in_edges.of(i).len() as u32)
            .collect();
        let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32)
            .filter(|&i| indegree[i as usize] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(node)) = ready.pop() {
            order.push(node);
            for &edge in self.out_edges.of(node) {
                let target = self.target_of(edge);
                indegree[target as usize] -= 1;
                if indegree[target as usize] == 0 {
                    ready.push(Reverse(target));
                }
            }
        }
        if order.len() == n { Ok(order) } else { Err(()) }
    }

    pub(super) fn target_of(&self, edge: u32) -> u32 {
        self.links[edge as usize].map_or(NONE, |l| l.target)
    }

    pub(super) fn source_of(&self, edge: u32) -> u32 {
        self.links[edge as usize].map_or(NONE, |l| l.source)
    }

    /// One error per strongly connected component, naming one concrete cycle through its first
    /// declared node. Iterative ([`crate::graph::scc`]): a long cycle must not exhaust the stack.
    pub(super) fn report_cycles(&mut self) {
        let components =
            crate::graph::scc::strongly_connected_components(self.graph.nodes.len(), |v, i| {
                self.out_edges.of(v).get(i).map(|&e| self.target_of(e))
            });
        // One component id per node (not a mark array per component: that would cost
        // O(N) for each of up to N/2 components).
        let mut component_of = vec![NONE; self.graph.nodes.len()];
        let mut cycles = Vec::new();
        for (id, component) in components.iter().enumerate() {
            let self_loop = component.len() == 1
                && self
                    .out_edges
                    .of(component[0])
                    .iter()
                    .any(|&e| self.target_of(e) == component[0]);
            if component.len() < 2 && !self_loop {
                continue;
            }
            for &node in component {
                component_of[node as usize] = id as u32;
            }
            let Some(&start) = component.iter().min() else {
                continue;
            };
            cycles.push(self.cycle_through(start, id as u32, &component_of));
        }
        cycles.sort();
        for cycle in cycles {
            let nodes = cycle
                .iter()
                .map(|&i| self.node_name(i).to_string())
                .collect();
            self.push(ValidationError::Cycle { nodes });
        }
    }

    /// Shortest cycle from `start` back to itself inside one component (breadth-first).
    pub(super) fn cycle_through(
        &self,
        start: u32,
        component: u32,
        component_of: &[u32],
    ) -> Vec<u32> {
        let mut parent: HashMap<u32, u32> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for &edge in self.out_edges.of(node) {
                let next = self.target_of(edge);
                if next == start {
                    let mut path = vec![node];
                    let mut at = node;
                    while at != start {
                        match parent.get(&at) {
                            Some(&up) => at = up,
                            None => break,
                        }
                        path.push(at);
                    }
                    path.reverse();
                    path.push(start);
                    return path;
                }
                if component_of[next as usize] == component
                    && next != start
                    && !parent.contains_key(&next)
                {
                    parent.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
        vec![start, start]
    }

    /// Marks nodes reachable from the ingress; reports the others. `None` without an ingress.
    pub(super) fn check_reachability(&mut self) -> Option<Vec<bool>> {
        if self.ingress == NONE {
            return None;
        }
        let n = self.graph.nodes.len();
        let mut reachable = vec![false; n];
        reachable[self.ingress as usize] = true;
        let mut stack = vec![self.ingress];
        while let Some(node) = stack.pop() {
            for &edge in self.out_edges.of(node) {
                let target = self.target_of(edge);
                if !reachable[target as usize] {
                    reachable[target as usize] = true;
                    stack.push(target);
                }
            }
        }
        let ingress = self.node_name(self.ingress).to_string();
        for index in 0..n as u32 {
            // A second input node is already reported as such.
            let is_input = matches!(self.node_kind(index), Some(node::Kind::Input(_)));
            if !reachable[index as usize] && !is_input && !self.duplicate[index as usize] {
                self.push(ValidationError::Unreachable {
                    node: self.node_name(index).to_string(),
                    ingress: ingress.clone(),
                });
            }
        }
        Some(reachable)
    }

    /// Checks that need a DAG and an ingress: shadow branches, dead ends, predicate scopes and
    /// joins that could never run.
    pub(super) fn check_acyclic_structure(&mut self, order: &[u32], reachable: &[bool]) {
        let graph = self.graph;
        let n = graph.nodes.len();
        // Shadow: marked nodes, and nodes fed only by shadow nodes.
        let mut shadow = vec![false; n];
        for &node in order {
            let i = node as usize;
            let marked = graph.nodes[i].shadow.is_some()
                && matches!(graph.nodes[i].kind, Some(node::Kind::Model(_)));
            let fed_only_by_shadow = !self.in_edges.of(node).is_empty()
                && self
                    .in_edges
                    .of(node)
                    .iter()
                    .all(|&e| shadow[self.source_of(e) as usize]);
            shadow[i] = marked || (node != self.ingress && fed_only_by_shadow);
        }
        for (index, link) in self.links.iter().enumerate() {
            if let Some(link) = link
                && shadow[link.source as usize]
                && !shadow[link.target as usize]
            {
                let edge = self.edge_ref(index);
                self.errors.push(ValidationError::ShadowLeak {
                    edge,
                    node: self.node_name(link.target).to_string(),
                });
            }
        }
        if self.output != NONE {
            let mut reaches_output = vec![false; n];
            reaches_output[self.output as usize] = true;
            for &node in order.iter().rev() {
                let i = node as usize;
                if self
                    .out_edges
                    .of(node)
                    .iter()
                    .any(|&e| reaches_output[self.target_of(e) as usize])
                {
                    reaches_output[i] = true;
                }
            }
            let output = self.node_name(self.output).to_string();
            for &node in order {
                let i = node as usize;
                if reachable[i] && !reaches_output[i] && !shadow[i] {
                    self.push(ValidationError::DeadEnd {
                        node: self.node_name(node).to_string(),
                        output: output.clone(),
                    });
                }
            }
        }
        self.check_scopes(order);
        self.check_exclusive_joins(order, reachable);
    }
}

/// Edges per node in compressed form (one offsets array, one list): no allocation per node.
#[derive(Default)]
pub(super) struct Adjacency {
    start: Vec<u32>,
    list: Vec<u32>,
}

impl Adjacency {
    /// From (node, edge) pairs; each node's edges keep the order of the pairs.
    pub(super) fn build(n: usize, pairs: impl Iterator<Item = (u32, u32)> + Clone) -> Self {
        let mut start = vec![0u32; n + 1];
        for (node, _) in pairs.clone() {
            start[node as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut list = vec![0u32; start[n] as usize];
        for (node, edge) in pairs {
            list[next[node as usize] as usize] = edge;
            next[node as usize] += 1;
        }
        Adjacency { start, list }
    }

    pub(super) fn of(&self, node: u32) -> &[u32] {
        let node = node as usize;
        match (self.start.get(node), self.start.get(node + 1)) {
            (Some(&from), Some(&to)) => &self.list[from as usize..to as usize],
            _ => &[],
        }
    }
}
