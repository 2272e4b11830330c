use super::*;

fn order(w: &Wire) -> Vec<&str> {
    w.bootstrap_servers().map(|(_, a)| a).collect()
}

/// The bootstrap server that answered last is asked first, by every clone; the others follow
/// in their configured order, each once.
#[test]
fn the_bootstrap_server_that_answered_last_is_asked_first() {
    let w = Wire::new(Cluster::new("a:1, b:2,c:3", Default::default()), Duration::from_secs(1));
    assert_eq!(order(&w), ["a:1", "b:2", "c:3"]);
    let clone = w.clone();
    clone.answered(1);
    assert_eq!(order(&w), ["b:2", "c:3", "a:1"]);
    w.answered(2);
    assert_eq!(order(&clone), ["c:3", "a:1", "b:2"]);
    let none = Wire::new(Cluster::new("", Default::default()), Duration::from_secs(1));
    assert_eq!(order(&none), Vec::<&str>::new());
}

/// EndTxn (not repeatable) is not sent again by the client after an answer that the
/// coordinator moved or is loading, nor after a lost answer — it may have been applied, and
/// the recovery describes the transaction first — only when it never left. DescribeTransactions
/// (repeatable) is sent again after all three. Before, a coordinator-moving answer was retried
/// for every request, EndTxn included.
#[test]
fn end_txn_is_sent_again_only_when_it_never_left() {
    let moving = [
        code::NOT_COORDINATOR,
        code::COORDINATOR_NOT_AVAILABLE,
        code::COORDINATOR_LOAD_IN_PROGRESS,
    ];
    for c in moving {
        assert!(
            !send_again(Resend::OnlyUnsent, Tried::Answered(c)),
            "EndTxn after error code {c}"
        );
        assert!(
            send_again(Resend::AfterRefusal, Tried::Answered(c)),
            "TxnOffsetCommit after {c}"
        );
        assert!(
            send_again(Resend::Always, Tried::Answered(c)),
            "a description after error code {c}"
        );
    }
    assert!(!send_again(Resend::OnlyUnsent, Tried::AnswerLost));
    assert!(
        !send_again(Resend::AfterRefusal, Tried::AnswerLost),
        "a lost TxnOffsetCommit may land late"
    );
    assert!(send_again(Resend::Always, Tried::AnswerLost));
    assert!(send_again(Resend::OnlyUnsent, Tried::Unsent));
    assert!(send_again(Resend::Always, Tried::Unsent));
    // Any other answer is the caller's.
    for c in [
        code::NONE,
        code::CONCURRENT_TRANSACTIONS,
        code::TRANSACTIONAL_ID_NOT_FOUND,
    ] {
        assert!(!send_again(Resend::OnlyUnsent, Tried::Answered(c)), "{c}");
        assert!(!send_again(Resend::Always, Tried::Answered(c)), "{c}");
    }
}
