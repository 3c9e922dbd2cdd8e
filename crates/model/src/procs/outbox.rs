//! Carrying out an outbox frame by frame (as store/src/turns.rs `run_outbox` does), with the
//! fence moves and chat releases its effects make.

use super::*;

pub(super) fn frame_step(m: &Protocol, w: &mut World, p: ProcIx, frame: Frame) -> bool {
    let top = w.procs[p].stack.len() - 1;
    match frame {
        Frame::Admit { turn, history } => {
            let admitted = apply(w, turn, &Event::Admitted { history });
            w.procs[p].stack[top] = match admitted {
                None => return pop(w, p),
                Some((record, Some(Unchanged::AlreadyEnded { .. }))) => {
                    // Ended before it joined (killed): let the chat go to its next turn.
                    if m.bugs.keep_ended_turn_live {
                        return pop(w, p);
                    }
                    match release(m, w, &record) {
                        Some((next, history)) if next != turn => Frame::Admit {
                            turn: next,
                            history,
                        },
                        _ => return pop(w, p),
                    }
                }
                Some((record, _)) => outbox(turn, record),
            };
            true
        }
        Frame::Outbox {
            turn,
            snapshot,
            i,
            sub,
        } => {
            let Some(effect) = snapshot.outbox.get(i).cloned() else {
                if i > snapshot.outbox.len() {
                    // Carried out: an ended turn leaves the live index.
                    w.live.remove(&turn);
                    return pop(w, p);
                }
                // All carried out; nothing is written back (the record's next write drops what
                // it proves done). An ended turn's next step is leaving the live index.
                if !snapshot.state.is_terminal() {
                    return pop(w, p);
                }
                w.procs[p].stack[top] = Frame::Outbox {
                    turn,
                    snapshot,
                    i: i + 1,
                    sub: 0,
                };
                return true;
            };
            let mut sub_next = 0;
            match &effect {
                Effect::DispatchAttempt {
                    attempt,
                    not_before: None,
                } => w.publish_work(turn, *attempt, true),
                Effect::DispatchAttempt { attempt, .. } => {
                    w.schedules.insert((turn, *attempt));
                }
                Effect::Notify { kind, .. } => {
                    let dup = w
                        .out
                        .iter()
                        .any(|o| matches!(o, Out::Notice { turn: u, .. } if *u == turn));
                    if !dup {
                        w.out.push(Out::Notice { turn, kind: *kind });
                    }
                }
                Effect::FlagChatErrored { .. } => {}
                Effect::SaveWorkspace { attempt, .. } => save_workspace(m, w, turn, *attempt),
                Effect::ForwardKill { attempt } => {
                    if !m.bugs.kill_without_fence {
                        kill_fence(m, w, turn, *attempt);
                    }
                    w.kills.insert((turn, *attempt));
                }
                Effect::CancelAttempt { attempt } => {
                    let key = (turn, *attempt);
                    w.schedules.remove(&key);
                    let claimed = w.claims.contains_key(&key);
                    if !claimed {
                        w.claims.insert(key, Claim::Cancelled);
                    }
                    kill_fence(m, w, turn, *attempt);
                    if claimed {
                        w.kills.insert(key);
                    }
                }
                Effect::Ended { state } => match sub {
                    0 => {
                        if !w.has_final(turn) {
                            w.out.push(Out::Final {
                                turn,
                                state: *state,
                            });
                        }
                        sub_next = 1;
                    }
                    _ => {
                        if let Some((next, history)) = release(m, w, &snapshot) {
                            if next != turn {
                                w.procs[p].stack.push(Frame::Admit {
                                    turn: next,
                                    history,
                                });
                            }
                        }
                    }
                },
            }
            let (i, sub) = if sub_next == 0 {
                (i + 1, 0)
            } else {
                (i, sub_next)
            };
            w.procs[p].stack[top] = Frame::Outbox {
                turn,
                snapshot,
                i,
                sub,
            };
            true
        }
    }
}

pub(super) fn kill_fence(m: &Protocol, w: &mut World, turn: Turn, attempt: Attempt) {
    let last = w.fence_last(turn);
    if let Kill::Append { expect } = fence::kill(last.as_ref()) {
        let holder = FenceHolder::Killed { by: "op".into() };
        w.fence_append(turn, &m.ids.turns[turn], attempt, holder, expect);
    }
}

/// Release an ended turn from its chat; the chat's live turn afterwards, to admit.
pub(super) fn release(
    m: &Protocol,
    w: &mut World,
    record: &TurnRecord,
) -> Option<(Turn, Vec<HistoryEntry>)> {
    let t = m.ids.turns.iter().position(|id| *id == record.turn)?;
    let replies = vec!["reply".to_owned(); w.messages_of(t, None) as usize];
    let c = w.chat.as_mut()?;
    let released = chat::release(c, record, &replies, BUDGET);
    let (next, history) = released.next?;
    let next = m.ids.turns.iter().position(|id| *id == next)?;
    Some((next, history))
}

/// The chat's workspace becomes what `attempt` left, if it still holds the fence (as
/// `store::workspaces::save` checks): a superseded attempt's writes are discarded.
fn save_workspace(m: &Protocol, w: &mut World, turn: Turn, attempt: Attempt) {
    let holds = w
        .fence_last(turn)
        .and_then(|l| l.marker)
        .is_some_and(|marker| {
            marker.attempt == attempt
                && matches!(
                    marker.holder,
                    turnpike_core::fence::FenceHolder::Runner { .. }
                )
        });
    if !holds && !m.bugs.save_without_fence {
        return;
    }
    // Judged apart from the check: superseded means a later attempt started, or this one was
    // declared lost or killed.
    let later_started = w
        .ghost
        .starts
        .keys()
        .any(|(t, k)| *t == turn && *k > attempt);
    let fenced_out = w.fences[turn].iter().any(|marker| {
        marker.attempt == attempt
            && !matches!(
                marker.holder,
                turnpike_core::fence::FenceHolder::Runner { .. }
            )
    });
    if later_started || fenced_out {
        w.ghost.bad_save = Some("a superseded attempt's workspace was saved");
    } else if w.record(turn).map(|r| r.state) != Some(turnpike_core::record::TurnState::Done) {
        w.ghost.bad_save = Some("a workspace was saved by a turn that did not end done");
    }
    w.ghost.saved.insert((turn, attempt));
}
