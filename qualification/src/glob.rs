//! `--filter` patterns: `*` matches any run of characters, `?` one; several patterns are
//! separated by commas and a case runs when any matches its id or its group name.

/// Whether `text` matches the glob `pattern`.
pub fn matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with one backtrack point for the last `*`.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// A set of comma-separated patterns; empty selects everything.
#[derive(Debug, Clone, Default)]
pub struct Filter(Vec<String>);

impl Filter {
    pub fn new<S: AsRef<str>>(specs: &[S]) -> Filter {
        Filter(
            specs
                .iter()
                .flat_map(|s| s.as_ref().split(','))
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        )
    }

    /// A bare group name selects the whole group; otherwise the glob must match the id.
    pub fn selects(&self, id: &str, group: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|p| p == group || matches(p, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_question_marks_match_like_a_shell() {
        assert!(matches("stream.*", "stream.done_last"));
        assert!(matches("*.done_*", "stream.done_last"));
        assert!(matches(
            "input.max_tokens.?tring",
            "input.max_tokens.string"
        ));
        assert!(matches("*", ""));
        assert!(!matches("stream.*", "api.stream"));
        assert!(!matches("a*b", "acbd"));
        assert!(matches("a*b*c", "axxbyyc"));
    }

    #[test]
    fn a_group_name_selects_its_cases() {
        let f = Filter::new(&["stream, completions.stream.*"]);
        assert!(f.selects("stream.role_first", "stream"));
        assert!(f.selects("completions.stream.framing", "completions"));
        assert!(!f.selects("completions.echo.prefix", "completions"));
        assert!(Filter::new::<&str>(&[]).selects("x", "y"));
    }
}
