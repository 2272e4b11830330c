use super::*;

#[test]
fn growth_is_flat_within_five_percent_or_the_resolution() {
    assert!(growth(100.0, 105.0, 0.0).1);
    assert!(!growth(100.0, 106.0, 1.0).1);
    assert!(growth(7.0, 8.5, 2.0).1);
}

#[test]
fn a_judged_json_carries_its_records_audit() {
    let dir = tempfile::tempdir().unwrap();
    let write = |records: &str| {
        let path = dir.path().join("soak.json");
        let sample = r#"{"bench":"soak","case":"sample 10","figures":{"t_s":10,"incarnation":1,"rss_mb":70,"lag":5}}"#;
        std::fs::write(&path, format!(r#"{{"rows":[{sample}{records}]}}"#)).unwrap();
        read_json(&path).unwrap().3
    };
    let clean = r#","fed":9,"in_input":9,"duplicates":0,"missing":0,"foreign":0,"not_delivered":0,"drained":1,"exited_by_itself":0"#;
    let row = |figures: &str| format!(r#",{{"bench":"soak","case":"records","figures":{{"x":0{figures}}}}}"#);
    assert!(write(&row(clean)).is_empty());
    let lost = write(&row(&clean.replace(r#""missing":0"#, r#""missing":2"#)));
    assert_eq!(lost, vec!["2 never read".to_owned()]);
    assert_eq!(
        write(""),
        vec!["the run ended before its records were audited".to_owned()]
    );
}

#[test]
fn the_trend_sees_a_steady_growth_whole_and_ignores_one_outlier() {
    // 7 % over the process's life, linearly: the trend's ends show all of it.
    let mut p: Vec<(f64, f64)> = (0..60)
        .map(|i| (f64::from(i) * 10.0, 100.0 + 7.0 * f64::from(i) / 59.0))
        .collect();
    let (a, b) = trend(&p).unwrap();
    assert!((a - 100.0).abs() < 1e-6 && (b - 107.0).abs() < 1e-6, "{a} {b}");
    assert!(!growth(a, b, 1.0).1);
    // Flat with one spike at the end: flat.
    p = (0..60).map(|i| (f64::from(i) * 10.0, 100.0)).collect();
    p[59].1 = 400.0;
    let (a, b) = trend(&p).unwrap();
    assert!(growth(a, b, 1.0).1, "{a} {b}");
    assert_eq!(trend(&p[..FEWEST - 1]), None);
}
