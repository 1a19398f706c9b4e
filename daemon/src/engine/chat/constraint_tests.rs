//! Unit tests of grammar preparation that need no model.

use super::constraint::compact;

#[test]
fn json_schemas_are_compacted_unless_they_choose() {
    let s = compact(&serde_json::json!({"type": "object"}));
    assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
    let own = serde_json::json!({"type": "object", "x-guidance": {"lenient": true}});
    assert_eq!(compact(&own), own);
}
