//! Text form of `Predicate`: exactly one key naming its form (`compare: {...}`), in YAML too
//! (serde_yaml would use tags).

use serde::de::Deserializer;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize, de};

use crate::graph::proto::{Compare, Predicate, PredicateList, Quantified, predicate};

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct PredicateText {
    compare: Option<Compare>,
    all_of: Option<PredicateList>,
    any_of: Option<PredicateList>,
    negate: Option<Box<Predicate>>,
    some: Option<Box<Quantified>>,
    every: Option<Box<Quantified>>,
}

impl Serialize for Predicate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(usize::from(self.p.is_some())))?;
        match &self.p {
            None => {}
            Some(predicate::P::Compare(c)) => map.serialize_entry("compare", c)?,
            Some(predicate::P::AllOf(l)) => map.serialize_entry("all_of", l)?,
            Some(predicate::P::AnyOf(l)) => map.serialize_entry("any_of", l)?,
            Some(predicate::P::Negate(p)) => map.serialize_entry("negate", p)?,
            Some(predicate::P::Some(q)) => map.serialize_entry("some", q)?,
            Some(predicate::P::Every(q)) => map.serialize_entry("every", q)?,
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Predicate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = PredicateText::deserialize(deserializer)?;
        let mut forms = Vec::new();
        if let Some(c) = text.compare {
            forms.push(("compare", predicate::P::Compare(c)));
        }
        if let Some(l) = text.all_of {
            forms.push(("all_of", predicate::P::AllOf(l)));
        }
        if let Some(l) = text.any_of {
            forms.push(("any_of", predicate::P::AnyOf(l)));
        }
        if let Some(p) = text.negate {
            forms.push(("negate", predicate::P::Negate(p)));
        }
        if let Some(q) = text.some {
            forms.push(("some", predicate::P::Some(q)));
        }
        if let Some(q) = text.every {
            forms.push(("every", predicate::P::Every(q)));
        }
        if forms.len() > 1 {
            let names: Vec<&str> = forms.iter().map(|(name, _)| *name).collect();
            return Err(de::Error::custom(format_args!(
                "a predicate has exactly one of compare, all_of, any_of, negate, some, every; this one has {}",
                names.join(", ")
            )));
        }
        // An empty predicate is left to validation, which names the edge.
        Ok(Predicate {
            p: forms.pop().map(|(_, p)| p),
        })
    }
}
