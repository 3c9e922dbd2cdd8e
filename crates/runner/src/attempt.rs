//! One attempt on this runner, start to end: take it (`claim`), take its fence, fetch its
//! attachments, run it on the backend while `land` publishes what the agent says, classify how
//! it ended, and report that (`events`).

use crate::backend::{Output, RunSpec};
use crate::context::RunnerContext;
use crate::events::{emit, report_exit};
use crate::patience::patiently;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn, Instrument};
use turnpike_core::exit::{classify, StopReason};
use turnpike_core::wire::{AttemptStart, ExitReport, RunnerEventKind, WorkItem};
use turnpike_core::Timestamp;
use turnpike_jetstream::{decode, now};
use turnpike_store::fence::Taken;

/// Take one work message from the runners' consumer and see it through.
pub(crate) async fn handle(ctx: Arc<RunnerContext>, msg: async_nats::jetstream::Message) {
    let work: WorkItem = match decode(msg.headers.as_ref(), &msg.payload) {
        Ok(w) => w,
        Err(e) => {
            // The runner's one way to refuse input (as every role: dead letter, counted).
            turnpike_jetstream::refuse(
                &ctx.bus.js,
                "runner",
                &msg,
                &format!("undecodable work item: {e}"),
                &ctx.refused,
            )
            .await;
            return;
        }
    };
    let span = tracing::info_span!("attempt", turn_id = %work.turn, attempt = work.attempt,
        chat_id = %work.chat, runner_id = %ctx.id);
    run(ctx, msg, work).instrument(span).await
}

/// One attempt on this runner, as its steps: claim it ([`Attempt::claim`]), take its fence
/// ([`Attempt::fence`]), fetch its attachments ([`Attempt::attachments`]), run it while its
/// output lands ([`Attempt::run`]), and say how it ended ([`Attempt::exit_report`]), which
/// `events::report_exit` reports. A step that ends the attempt early returns its exit report.
struct Attempt {
    ctx: Arc<RunnerContext>,
    msg: async_nats::jetstream::Message,
    work: WorkItem,
    /// When the work item was published: the start of the attempt's time in the queue.
    published_at: Timestamp,
    /// Why the run must stop, once something says so (a kill, the lease, the time limit).
    stop_tx: Arc<watch::Sender<Option<StopReason>>>,
    stop_rx: watch::Receiver<Option<StopReason>>,
    /// The fence's sequence once this attempt holds it: the lease loop checks it is still ours.
    fence_tx: watch::Sender<Option<u64>>,
    /// When the agent's watchdog must stop it if this runner cannot: moved on by every renewal.
    watchdog: watch::Receiver<std::time::Instant>,
    /// The resource profile the work item names, as this runner's configuration defines it;
    /// why not, if it does not.
    profile: Result<turnpike_config::Profile, String>,
}

/// What a step that ends the attempt early leaves to report.
type Ended = ExitReport;

async fn run(ctx: Arc<RunnerContext>, msg: async_nats::jetstream::Message, work: WorkItem) {
    // Listen for kills before claiming: a kill sent at any moment after the claim reaches us.
    // The fence catches any kill the runner's subscription misses (it is plain NATS).
    let (stop_tx, stop_rx) = watch::channel::<Option<StopReason>>(None);
    let stop_tx = Arc::new(stop_tx);
    let _kills = ctx
        .kills
        .register(&work.turn, work.attempt, stop_tx.clone());
    let claimed = Attempt::claim(ctx.clone(), msg, work, stop_tx, stop_rx).await;
    let Some((attempt, lease)) = claimed else {
        return;
    };
    if let Some(report) = attempt.settle().await {
        report_exit(&attempt.ctx, &attempt.work, report).await;
    }
    lease.abort();
}

impl Attempt {
    /// Claim the attempt and start its lease (from a heartbeat after the claim until the exit
    /// is reported: while it lives, renewed every heartbeat, the attempt is ours and alive; a
    /// lease that lapses is never renewed again, and stops the run). `None`: not ours to run.
    async fn claim(
        ctx: Arc<RunnerContext>,
        msg: async_nats::jetstream::Message,
        work: WorkItem,
        stop_tx: Arc<watch::Sender<Option<StopReason>>>,
        stop_rx: watch::Receiver<Option<StopReason>>,
    ) -> Option<(Attempt, tokio::task::JoinHandle<()>)> {
        let published_at = msg
            .info()
            .map(|i| Timestamp::from_system_time(SystemTime::from(i.published)))
            .unwrap_or_else(|_| now());
        let claimed_at = std::time::Instant::now();
        if !crate::claim::take(&ctx, &msg, &work).await {
            return None;
        }
        let (fence_tx, fence_rx) = watch::channel::<Option<u64>>(None);
        let (watchdog_tx, watchdog) = watch::channel(crate::lease::watchdog_deadline(
            claimed_at,
            ctx.config.lease,
            ctx.config.heartbeat,
        ));
        let lease = crate::lease::keep_alive(
            ctx.clone(),
            work.turn.clone(),
            work.attempt,
            stop_tx.clone(),
            fence_rx,
            watchdog_tx,
            claimed_at,
        );
        let profile = ctx.config.profile(work.profile.as_deref()).ok_or_else(|| {
            format!(
                "profile {} is not defined on runner {} (defined: {})",
                work.profile
                    .as_deref()
                    .unwrap_or(&ctx.config.default_profile),
                ctx.id,
                ctx.config.profile_names().join(", ")
            )
        });
        let attempt = Attempt {
            ctx,
            msg,
            work,
            published_at,
            stop_tx,
            stop_rx,
            fence_tx,
            watchdog,
            profile,
        };
        Some((attempt, lease))
    }

    /// The claimed attempt's remaining steps; its exit report (`None`: what it landed could not
    /// be settled; the sweep will).
    async fn settle(&self) -> Option<ExitReport> {
        // The claim makes any redelivery harmless from here on, whatever happens next: a plain
        // ack (no round trip) is enough, since a lost one only brings a delivery the claim turns
        // away.
        if let Err(e) = self.msg.ack().await {
            debug!(error = %e, "ack of the work item failed; the claim keeps it ours");
        }
        let mut report = match self.fenced_run().await {
            Ok(run) => self.exit_report(run).await?,
            Err(ended) => ended,
        };
        report.started.get_or_insert_with(|| self.start(None));
        Some(report)
    }

    /// Who ran the attempt, when, and with which profile, as its exit report says
    /// (`started_at: None`: the agent never started).
    fn start(&self, started_at: Option<Timestamp>) -> AttemptStart {
        AttemptStart {
            runner: self.ctx.id.clone(),
            published_at: self.published_at,
            started_at,
            profile: self
                .profile
                .as_ref()
                .ok()
                .map(|p| turnpike_core::wire::ProfileUsed {
                    name: p.name.clone(),
                    memory_limit: p.memory_limit.0,
                }),
        }
    }

    async fn fenced_run(&self) -> Result<Run, Ended> {
        let fence_seq = self.fence().await?;
        let profile = self.profile.as_ref().map_err(|why| {
            warn!(
                why,
                "the attempt's profile is unknown here; the agent cannot start"
            );
            ExitReport::without_output(
                turnpike_core::wire::ExitClass::CouldNotStart,
                why.clone(),
                now(),
            )
        })?;
        let secrets = self.secrets(profile).await?;
        // Kept until the run is over: the backend reads the files from it.
        let spool = self.attachments().await?;
        let workspace = self.workspace(profile).await?;
        Ok(self
            .run(fence_seq, &spool, profile, secrets, workspace)
            .await)
    }

    /// The chat's workspace, restored into a directory of the attempt's, when its profile gives
    /// one. A store that does not answer is tried again, as the fence is.
    async fn workspace(
        &self,
        profile: &turnpike_config::Profile,
    ) -> Result<Option<crate::workspace::Workspace>, Ended> {
        let max = profile.workspace_max_bytes.0;
        if max == 0 {
            return Ok(None);
        }
        let (ctx, work) = (&self.ctx, &self.work);
        patiently(
            &self.stop_rx,
            ctx.config.run_timeout,
            || {
                crate::workspace::Workspace::restore(
                    &ctx.bus,
                    ctx.config.scratch_dir.as_deref(),
                    work,
                    max,
                )
            },
            turnpike_jetstream::BusError::is_transient,
        )
        .await
        .map(Some)
        .map_err(|gave_up| {
            warn!(error = %gave_up.error, stopped = ?gave_up.stopped, "the chat's workspace cannot be restored; the attempt dies and may be retried");
            gave_up.report("workspace unavailable")
        })
    }

    /// Read the agent's secrets now (a rotated file counts from the next attempt on). One that
    /// cannot be read means the agent cannot start; the error names it, never its value.
    async fn secrets(
        &self,
        profile: &turnpike_config::Profile,
    ) -> Result<crate::secrets::Secrets, Ended> {
        let Some(dir) = self.ctx.config.secrets_dir.as_deref() else {
            return Ok(crate::secrets::Secrets::default());
        };
        crate::secrets::Secrets::read(dir, &profile.agent_secrets)
            .await
            .map_err(|e| {
                warn!(error = %e, "a secret cannot be given to the agent");
                ExitReport::without_output(
                    turnpike_core::wire::ExitClass::CouldNotStart,
                    e.to_string(),
                    now(),
                )
            })
    }

    /// Take the fence: from here on, this attempt's bot messages land only while the turn's
    /// fence is ours. Taken by compare-and-set, so a kill or a loss decided before this point is
    /// never overrun. A NATS failure is tried again: nothing has run, and an attempt spent on a
    /// leader election would be one less for the agent. While the lease is renewed nothing is
    /// lost by waiting (a stream's election can outlast a lease); the run's own time limit
    /// bounds it.
    async fn fence(&self) -> Result<u64, Ended> {
        use turnpike_core::wire::ExitClass;
        let (ctx, work) = (&self.ctx, &self.work);
        let taken = patiently(
            &self.stop_rx,
            ctx.config.run_timeout,
            || turnpike_store::fence::take(&ctx.bus, &work.turn, work.attempt, &ctx.id),
            turnpike_jetstream::BusError::is_transient,
        )
        .await;
        let seq = match taken {
            Ok(Taken::Ours(seq)) => seq,
            Ok(Taken::Killed) => {
                return Err(not_run(
                    ExitClass::OperatorKilled,
                    "killed by an operator before it started",
                ))
            }
            Ok(Taken::Lost) => {
                return Err(not_run(
                    ExitClass::RunnerLost,
                    "declared lost before it started",
                ))
            }
            Err(gave_up) => {
                // Without the fence nothing can land safely. Report a death so the coordinator
                // decides (a retry, if the budget allows).
                warn!(error = %gave_up.error, stopped = ?gave_up.stopped, "cannot take the attempt fence");
                return Err(gave_up.report("cannot take the fence"));
            }
        };
        self.fence_tx.send_replace(Some(seq));
        Ok(seq)
    }

    /// Fetch the attachments into a spool on disk. An object store that does not answer is
    /// tried again, as the fence is; an attachment refused for good means the agent cannot
    /// start.
    async fn attachments(&self) -> Result<crate::attachments::Spool, Ended> {
        use crate::attachments::AttachmentError;
        let (ctx, work) = (&self.ctx, &self.work);
        let fetched = patiently(
            &self.stop_rx,
            ctx.config.run_timeout,
            || crate::attachments::fetch(&ctx.bus, &ctx.config, work),
            |e| matches!(e, AttachmentError::Unavailable(_)),
        )
        .await;
        fetched.map_err(|gave_up| match gave_up.error {
            AttachmentError::Refused(e) => {
                warn!(error = %e, "attachments refused");
                ExitReport::without_output(
                    turnpike_core::wire::ExitClass::CouldNotStart,
                    e,
                    now(),
                )
            }
            AttachmentError::Unavailable(_) => {
                warn!(error = %gave_up.error, stopped = ?gave_up.stopped, "attachments unavailable; the attempt dies and may be retried");
                gave_up.report("attachments unavailable")
            }
        })
    }

    /// Run the agent on the backend while its output lands on the chat, under fence `fence_seq`,
    /// until it exits or is stopped.
    async fn run(
        &self,
        fence_seq: u64,
        spool: &crate::attachments::Spool,
        profile: &turnpike_config::Profile,
        secrets: crate::secrets::Secrets,
        workspace: Option<crate::workspace::Workspace>,
    ) -> Run {
        let (ctx, work) = (&self.ctx, &self.work);
        // The time limit's clock starts here (`Causes::watch` below): the deadline is no later
        // than when the run is stopped.
        let deadline = now().saturating_add(profile.run_timeout);
        let spec = RunSpec {
            work: work.clone(),
            attachments: spool.files.clone(),
            profile: profile.clone(),
            deadline,
            secrets: secrets.clone(),
            workspace: workspace.as_ref().map(|w| w.path().to_path_buf()),
            stop_grace: ctx.config.stop_grace,
            watchdog: self.watchdog.clone(),
        };
        let (out_tx, mut out_rx) = mpsc::channel::<Output>(64);
        // The time limit and a hard stop of the runner (operator kills are routed by `kills`).
        let causes = crate::stop::Causes::watch(profile.run_timeout, &ctx.hard_stop, &self.stop_tx);
        let backend_inner = ctx.clone();
        let stop_rx = self.stop_rx.clone();
        let run =
            tokio::spawn(async move { backend_inner.backend.run(&spec, out_tx, stop_rx).await });
        let redactor = secrets.redactor();
        let mut lander = crate::land::Lander::new(ctx, work, fence_seq, redactor.clone());
        let mut stderr = crate::lines::LineSplitter::new(crate::lines::MAX_LINE);
        let mut started_at = None;
        while let Some(chunk) = out_rx.recv().await {
            match chunk {
                // Only now is the turn running: the agent has started.
                Output::Started => {
                    started_at = Some(now());
                    let started = RunnerEventKind::Started {
                        published_at: self.published_at,
                    };
                    emit(ctx, work, "started", started).await;
                    info!("attempt started");
                }
                Output::Stdout(bytes) => lander.stdout(&bytes, &self.stop_tx).await,
                Output::Stderr(bytes) => {
                    for line in stderr.push(&bytes) {
                        log_stderr(line, &redactor);
                    }
                }
            }
        }
        if let Some(line) = stderr.finish() {
            log_stderr(line, &redactor);
        }
        let landing = lander.finish(&self.stop_tx).await;
        let raw = match run.await {
            Ok(raw) => raw,
            Err(e) => turnpike_core::exit::RawExit {
                engine_error: Some(format!("backend task failed: {e}")),
                ..Default::default()
            },
        };
        drop(causes);
        Run {
            raw,
            landing,
            started_at,
            workspace,
        }
    }

    /// How the run ended, classified; `None` if what it landed could not be settled.
    async fn exit_report(&self, run: Run) -> Option<ExitReport> {
        let Run {
            raw,
            landing,
            started_at,
            workspace,
        } = run;
        let class = classify(&raw, landing.verdict, landing.any_output);
        // Record who stopped the run, when the runner did.
        let stopped = raw
            .stopped_by
            .map(|why| format!("stopped by the runner: {why:?}"));
        let error = raw
            .start_error
            .clone()
            .or(raw.engine_error.clone())
            .or(stopped)
            .or(landing.verdict_error.clone());
        info!(?class, exit_code = ?raw.exit_code, signal = ?raw.signal, landed = landing.landed.count, cut = landing.cut, "attempt ended");
        let mut report = ExitReport {
            workspace: None,
            class,
            exit_code: raw.exit_code,
            signal: raw.signal,
            error,
            messages_landed: landing.landed.count,
            reply_span: landing.landed.span,
            output_cut: landing.cut,
            ended_at: now(),
            started: Some(self.start(started_at)),
        }
        .bounded();
        // A clean exit's workspace is stored as this attempt's; whether it becomes the chat's
        // is the coordinator's call (this exit must end the turn, holding the fence).
        if let (turnpike_core::wire::ExitClass::Clean, Some(ws)) = (class, &workspace) {
            report.workspace = ws.store(&self.ctx.bus, &self.work).await;
        }
        if landing.uncertain {
            crate::claim::settle_uncertain(&self.ctx, &self.work, &mut report).await?;
        }
        Some(report)
    }
}

/// A line the agent wrote on stderr, as a debug log: quoted cut short like every value from
/// outside, its secrets taken out (whole lines, so a secret split across reads is whole).
fn log_stderr(line: crate::lines::Line, redactor: &crate::secrets::Redactor) {
    use crate::lines::Line;
    let text = match line {
        Line::Text(t) => t,
        Line::Oversize { len, head } => format!("{head}… ({len} bytes)"),
        Line::NotUtf8 { len } => format!("({len} bytes, not UTF-8)"),
    };
    debug!(stderr = %turnpike_core::sizes::quote(&redactor.redact(&text)), "agent");
}

/// The exit of an attempt the fence says must not run at all.
fn not_run(class: turnpike_core::wire::ExitClass, why: &str) -> ExitReport {
    info!(why, "the attempt is not run");
    ExitReport::without_output(class, why, now())
}

/// A run that went through: how the process ended, what of its output landed, and when the
/// agent started (`None`: it never did).
struct Run {
    raw: turnpike_core::exit::RawExit,
    landing: crate::land::Landing,
    started_at: Option<Timestamp>,
    /// The attempt's copy of the chat's workspace, if its profile gives one.
    workspace: Option<crate::workspace::Workspace>,
}
