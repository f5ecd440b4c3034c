//! Strongly connected components without recursion (Tarjan's algorithm with an explicit call
//! stack): graph input decides the depth of a depth-first search, and a recursive search over a
//! 100,000-node cycle overflows a tokio worker's 2 MiB stack. Memory is O(N) besides the
//! components themselves.

const UNVISITED: u32 = u32::MAX;

/// The strongly connected components of the graph with nodes `0..node_count`, where
/// `successor(v, i)` is the `i`-th successor of `v` (`None` past the last). Components come in
/// reverse topological order (a component before every component that reaches it); nodes
/// within one component in no particular order.
pub fn strongly_connected_components(
    node_count: usize,
    successor: impl Fn(u32, usize) -> Option<u32>,
) -> Vec<Vec<u32>> {
    let mut index = vec![UNVISITED; node_count];
    let mut low = vec![0u32; node_count];
    let mut on_stack = vec![false; node_count];
    let mut stack: Vec<u32> = Vec::new();
    // The explicit call stack: a node and the position of its next successor to look at.
    let mut calls: Vec<(u32, usize)> = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0u32;
    for root in 0..node_count as u32 {
        if index[root as usize] != UNVISITED {
            continue;
        }
        index[root as usize] = next_index;
        low[root as usize] = next_index;
        next_index += 1;
        on_stack[root as usize] = true;
        stack.push(root);
        calls.push((root, 0));
        while let Some(&mut (node, ref mut position)) = calls.last_mut() {
            let v = node as usize;
            if let Some(next) = successor(node, *position) {
                *position += 1;
                let w = next as usize;
                if w >= node_count {
                    continue;
                }
                if index[w] == UNVISITED {
                    index[w] = next_index;
                    low[w] = next_index;
                    next_index += 1;
                    on_stack[w] = true;
                    stack.push(next);
                    calls.push((next, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent as usize] = low[parent as usize].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member as usize] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::strongly_connected_components;

    fn components_of(n: usize, edges: &[(u32, u32)]) -> BTreeSet<BTreeSet<u32>> {
        let mut successors = vec![Vec::new(); n];
        for &(a, b) in edges {
            successors[a as usize].push(b);
        }
        strongly_connected_components(n, |v, i| successors[v as usize].get(i).copied())
            .into_iter()
            .map(|c| c.into_iter().collect())
            .collect()
    }

    /// Reference: u and v share a component iff each reaches the other (closure by BFS).
    fn reference(n: usize, edges: &[(u32, u32)]) -> BTreeSet<BTreeSet<u32>> {
        let mut reach = vec![vec![false; n]; n];
        for (start, row) in reach.iter_mut().enumerate() {
            let mut queue = vec![start as u32];
            row[start] = true;
            while let Some(v) = queue.pop() {
                for &(a, b) in edges {
                    if a == v && !row[b as usize] {
                        row[b as usize] = true;
                        queue.push(b);
                    }
                }
            }
        }
        (0..n)
            .map(|u| {
                (0..n as u32)
                    .filter(|&v| reach[u][v as usize] && reach[v as usize][u])
                    .collect()
            })
            .collect()
    }

    #[test]
    fn finds_cycles_self_loops_and_singletons() {
        let found = components_of(5, &[(0, 1), (1, 2), (2, 0), (3, 3), (2, 4)]);
        let expected: BTreeSet<BTreeSet<u32>> = [vec![0, 1, 2], vec![3], vec![4]]
            .into_iter()
            .map(|c| c.into_iter().collect())
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn order_is_reverse_topological() {
        let successors = [vec![1u32], vec![2], vec![]];
        let order = strongly_connected_components(3, |v, i| successors[v as usize].get(i).copied());
        assert_eq!(order, vec![vec![2], vec![1], vec![0]]);
    }

    /// Run on a 2 MiB stack (a tokio worker's): a recursive search would overflow it and abort
    /// the test process.
    #[test]
    fn a_million_node_cycle_needs_no_stack() {
        let handle = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(|| {
                let n = 1_000_000u32;
                let components = strongly_connected_components(n as usize, |v, i| {
                    (i == 0).then_some((v + 1) % n)
                });
                components.len()
            })
            .expect("spawn");
        assert_eq!(handle.join().expect("no overflow"), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_mutual_reachability(
            (n, edges) in (1usize..12).prop_flat_map(|n| (Just(n), vec((0..n as u32, 0..n as u32), 0..30)))
        ) {
            prop_assert_eq!(components_of(n, &edges), reference(n, &edges));
        }
    }
}
