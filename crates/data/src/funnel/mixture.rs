//! Mixture: blends the kept documents of named sources by weight, with per-source epochs
//! (upsampling: `epochs = 2.0` repeats a source twice, `0.5` takes its first half).
//!
//! The blend is deterministic and smooth: at step `t` (1-based) it takes the next document of
//! the source that maximizes `weight * t - taken` (its deficit against its target share), ties to
//! the source listed first. Every prefix of the output is then within one document of the
//! weights for every source still running. A source that runs out (its epochs are spent) leaves
//! the blend; the others continue in their relative proportions.
//!
//! What it is not: a sampler; there is no randomness, and no document is dropped. It runs after
//! the filters and dedup (which see every document once), so repeats from upsampling are not
//! mistaken for duplicates.

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSourceFile {
    pub name: String,
    pub weight: f64,
    #[serde(default = "one")]
    pub epochs: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureFile {
    pub sources: Vec<MixtureSourceFile>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MixtureSource {
    pub name: String,
    /// Normalized so the weights sum to 1.
    pub weight: f64,
    pub epochs: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Mixture {
    pub sources: Vec<MixtureSource>,
}

impl MixtureFile {
    /// `source_names` are the `[[source]]` names of the run; every one must be weighted.
    pub fn validate(self, source_names: &[String]) -> Result<Mixture, String> {
        let mut total = 0.0;
        for s in &self.sources {
            if !source_names.contains(&s.name) {
                return Err(format!(
                    "mixture names source {:?}, which no [[source]] defines",
                    s.name
                ));
            }
            if !(s.weight.is_finite() && s.weight > 0.0) {
                return Err(format!(
                    "mixture weight of {:?} must be positive, got {}",
                    s.name, s.weight
                ));
            }
            if !(s.epochs.is_finite() && s.epochs > 0.0) {
                return Err(format!(
                    "mixture epochs of {:?} must be positive, got {}",
                    s.name, s.epochs
                ));
            }
            if self.sources.iter().filter(|o| o.name == s.name).count() > 1 {
                return Err(format!("mixture lists source {:?} twice", s.name));
            }
            total += s.weight;
        }
        if let Some(missing) = source_names
            .iter()
            .find(|n| !self.sources.iter().any(|s| &s.name == *n))
        {
            return Err(format!("source {missing:?} has no mixture weight"));
        }
        Ok(Mixture {
            sources: self
                .sources
                .into_iter()
                .map(|s| MixtureSource {
                    weight: s.weight / total,
                    name: s.name,
                    epochs: s.epochs,
                })
                .collect(),
        })
    }
}

impl Mixture {
    /// How many documents source `i` contributes given it kept `kept` documents.
    pub fn planned(&self, i: usize, kept: u64) -> u64 {
        (self.sources[i].epochs * kept as f64).round() as u64
    }

    /// The blend order: `(source index, document index within that source)` for every output
    /// document; `kept[i]` is the number of documents source `i` kept.
    pub fn schedule(&self, kept: &[u64]) -> Vec<(usize, u64)> {
        let planned: Vec<u64> = (0..self.sources.len())
            .map(|i| self.planned(i, kept[i]))
            .collect();
        let total: u64 = planned.iter().sum();
        let mut taken = vec![0u64; self.sources.len()];
        let mut order = Vec::with_capacity(total as usize);
        for step in 1..=total {
            let mut best: Option<(usize, f64)> = None;
            for (i, source) in self.sources.iter().enumerate() {
                if taken[i] >= planned[i] {
                    continue;
                }
                let deficit = source.weight * step as f64 - taken[i] as f64;
                if best.is_none_or(|(_, d)| deficit > d) {
                    best = Some((i, deficit));
                }
            }
            let Some((i, _)) = best else { break };
            order.push((i, taken[i] % kept[i].max(1)));
            taken[i] += 1;
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixture(spec: &[(&str, f64, f64)]) -> Mixture {
        let names: Vec<String> = spec.iter().map(|(n, _, _)| n.to_string()).collect();
        MixtureFile {
            sources: spec
                .iter()
                .map(|(n, w, e)| MixtureSourceFile {
                    name: n.to_string(),
                    weight: *w,
                    epochs: *e,
                })
                .collect(),
        }
        .validate(&names)
        .unwrap()
    }

    #[test]
    fn prefixes_track_the_weights_within_one_document() {
        let m = mixture(&[("web", 2.0, 1.0), ("books", 1.0, 1.0)]);
        let order = m.schedule(&[200, 100]);
        assert_eq!(order.len(), 300);
        let mut taken = [0f64; 2];
        for (t, (i, _)) in order.iter().enumerate() {
            taken[*i] += 1.0;
            let step = (t + 1) as f64;
            assert!((taken[0] - step * 2.0 / 3.0).abs() <= 1.0);
            assert!((taken[1] - step / 3.0).abs() <= 1.0);
        }
        assert_eq!(&order[..3], &[(0, 0), (1, 0), (0, 1)]);
    }

    #[test]
    fn epochs_repeat_a_source_in_order() {
        let m = mixture(&[("small", 1.0, 3.0), ("big", 1.0, 1.0)]);
        let order = m.schedule(&[2, 6]);
        let small: Vec<u64> = order
            .iter()
            .filter(|(i, _)| *i == 0)
            .map(|(_, d)| *d)
            .collect();
        assert_eq!(small, vec![0, 1, 0, 1, 0, 1]);
        assert_eq!(order.len(), 12);
    }

    #[test]
    fn unknown_or_unweighted_sources_are_rejected() {
        let names = vec!["a".to_string(), "b".to_string()];
        let only_a = MixtureFile {
            sources: vec![MixtureSourceFile {
                name: "a".into(),
                weight: 1.0,
                epochs: 1.0,
            }],
        };
        assert!(only_a.validate(&names).unwrap_err().contains("\"b\""));
        let ghost = MixtureFile {
            sources: vec![MixtureSourceFile {
                name: "zz".into(),
                weight: 1.0,
                epochs: 1.0,
            }],
        };
        assert!(ghost.validate(&names).unwrap_err().contains("zz"));
    }
}
