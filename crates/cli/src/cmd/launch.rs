//! `stoke launch CONFIG.toml --rollout-servers N [--reward-servers M] --rendezvous DIR`: one
//! command for every process of a distributed GRPO run, whatever started the processes. Each
//! process reads who it is from its launcher's variables and takes its role:
//!
//! | launcher | rank | world size | local rank |
//! |---|---|---|---|
//! | torchrun / torch.distributed | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | MPICH / Intel MPI (Hydra) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//! | Kubernetes JobSet | the role is `REPLICATED_JOB_NAME` (`trainer`, `rollout`, `reward`), the index `JOB_COMPLETION_INDEX` | | |
//!
//! (checked in that order: `srun` inside an MPI job or `mpirun` inside a Slurm allocation sets
//! both, and the inner launcher is the one that numbered this process). Without any of them the
//! process is a single trainer with in-process modules.
//!
//! Roles by rank: 0 is the trainer, 1..=N the rollout servers (`stoke serve` on the config's
//! model), N+1..=N+M the reward servers (`stoke reward-server` on the config's rewards). The world
//! size must be 1 + N + M.
//!
//! Rendezvous through the shared folder every process already needs for the weights: each server
//! binds `--host:--port + local rank`, then writes its URL (`http://ADVERTISED_HOST:PORT`) to
//! `DIR/rollout-I.url` or `DIR/reward-I.url` (written under another name and renamed). The
//! trainer waits for every file and for each server's `/health`, then runs `stoke grpo` with
//! `[rollout]` / `[reward]` pointing at them; at the end it writes `DIR/done`, on which the
//! servers stop. `DIR` gets a subfolder per job when the launcher names one (`SLURM_JOB_ID`,
//! `TORCHELASTIC_RUN_ID`, `JOBSET_NAME`), so a folder reused across jobs holds no stale URLs.
//!
//! The advertised host is `--advertise`, else `POD_IP` (Kubernetes' downward API), else the
//! machine's host name.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::remote::{RewardServerConfig, RunningRewardServer};
use stoke_serve::RunningServer;

use super::serve::EngineArgs;

#[derive(Args)]
pub struct LaunchArgs {
    /// The GRPO config every process reads (its model folder and the rendezvous folder must be
    /// on storage all processes see).
    config: PathBuf,
    /// Rollout servers (ranks 1..=N).
    #[arg(long)]
    rollout_servers: usize,
    /// Reward servers (the ranks after the rollout servers); 0 keeps rewards in the trainer.
    #[arg(long, default_value_t = 0)]
    reward_servers: usize,
    /// Shared folder for the servers' addresses and the end signal.
    #[arg(long)]
    rendezvous: PathBuf,
    /// Address servers bind.
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    /// First port; a server binds port + its local rank (several on one machine do not clash);
    /// 0 picks free ports.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The host name or address other machines reach this one by.
    #[arg(long)]
    advertise: Option<String>,
    /// How long the trainer waits for the servers, in seconds.
    #[arg(long, default_value_t = 900)]
    wait_s: u64,
    /// Override a key of the config (repeatable), as in `stoke grpo`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    #[arg(long)]
    resume: bool,
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Which launcher numbered this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Mpich,
    Slurm,
    JobSet,
    /// No launcher variables: one process.
    Single,
}

/// Who this process is, as its launcher says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub launcher: Launcher,
    /// Rank in the world (JobSet: the index within its replicated job).
    pub rank: usize,
    /// Processes in the world (JobSet: not known to one pod; 0).
    pub world_size: usize,
    pub local_rank: usize,
    /// JobSet only: the replicated job's name, which is the role.
    pub role_name: Option<String>,
    /// A name of this job, when the launcher gives one (rendezvous subfolder).
    pub job: Option<String>,
}

/// What this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Trainer,
    Rollout(usize),
    Reward(usize),
}

fn number(env: &dyn Fn(&str) -> Option<String>, key: &str) -> anyhow::Result<Option<usize>> {
    match env(key) {
        None => Ok(None),
        Some(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| anyhow!("{key}={text:?} is not a non-negative integer")),
    }
}

impl Placement {
    /// Reads the launcher variables through `env` (see the module doc for the order).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Placement> {
        let schemes: [(Launcher, &str, &str, &str, &[&str]); 4] = [
            (
                Launcher::Torchrun,
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                &["TORCHELASTIC_RUN_ID"],
            ),
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                &["SLURM_JOB_ID"],
            ),
            (
                Launcher::Mpich,
                "PMI_RANK",
                "PMI_SIZE",
                "MPI_LOCALRANKID",
                &["SLURM_JOB_ID"],
            ),
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                &["SLURM_JOB_ID"],
            ),
        ];
        for (launcher, rank_key, size_key, local_key, job_keys) in schemes {
            let (Some(rank), Some(world_size)) = (number(env, rank_key)?, number(env, size_key)?)
            else {
                continue;
            };
            if rank >= world_size {
                bail!("{rank_key}={rank} is not below {size_key}={world_size}");
            }
            return Ok(Placement {
                launcher,
                rank,
                world_size,
                local_rank: number(env, local_key)?.unwrap_or(0),
                role_name: None,
                job: job_keys.iter().find_map(|k| env(k)),
            });
        }
        if let Some(role) = env("REPLICATED_JOB_NAME") {
            let index = number(env, "JOB_COMPLETION_INDEX")?.ok_or_else(|| {
                anyhow!("REPLICATED_JOB_NAME={role} without JOB_COMPLETION_INDEX (an Indexed Job)")
            })?;
            return Ok(Placement {
                launcher: Launcher::JobSet,
                rank: index,
                world_size: 0,
                local_rank: 0,
                role_name: Some(role),
                job: env("JOBSET_NAME"),
            });
        }
        Ok(Placement {
            launcher: Launcher::Single,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            role_name: None,
            job: None,
        })
    }

    /// This process's role in a run of `rollout` + `reward` servers.
    pub fn role(&self, rollout: usize, reward: usize) -> anyhow::Result<Role> {
        if let Some(name) = &self.role_name {
            return match name.as_str() {
                "trainer" if self.rank == 0 => Ok(Role::Trainer),
                "trainer" => bail!(
                    "one trainer: JOB_COMPLETION_INDEX {} of `trainer`",
                    self.rank
                ),
                "rollout" if self.rank < rollout => Ok(Role::Rollout(self.rank)),
                "reward" if self.rank < reward => Ok(Role::Reward(self.rank)),
                "rollout" | "reward" => bail!(
                    "index {} of `{name}` is past --{name}-servers ({})",
                    self.rank,
                    if name == "rollout" { rollout } else { reward }
                ),
                other => bail!(
                    "REPLICATED_JOB_NAME={other:?}: name the replicated jobs trainer, rollout and reward"
                ),
            };
        }
        let expected = 1 + rollout + reward;
        if self.launcher != Launcher::Single && self.world_size != expected {
            bail!(
                "{:?} started {} processes; 1 trainer + {rollout} rollout + {reward} reward servers \
                 need {expected}",
                self.launcher,
                self.world_size
            );
        }
        Ok(match self.rank {
            0 => Role::Trainer,
            r if r <= rollout => Role::Rollout(r - 1),
            r => Role::Reward(r - 1 - rollout),
        })
    }
}

fn url_file(dir: &Path, role: Role) -> PathBuf {
    match role {
        Role::Rollout(i) => dir.join(format!("rollout-{i}.url")),
        Role::Reward(i) => dir.join(format!("reward-{i}.url")),
        Role::Trainer => dir.join("trainer.url"),
    }
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let staging = path.with_extension("staging");
    std::fs::write(&staging, text).with_context(|| format!("writing {}", staging.display()))?;
    std::fs::rename(&staging, path).with_context(|| format!("renaming to {}", path.display()))
}

/// One line to stderr in one write: processes of a job often share one log, and a line written
/// in pieces interleaves with the others'.
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into())
}

pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    let env = |key: &str| std::env::var(key).ok();
    let placement = Placement::from_env(&env)?;
    let role = placement.role(args.rollout_servers, args.reward_servers)?;
    let dir = match &placement.job {
        Some(job) => args.rendezvous.join(job),
        None => args.rendezvous.clone(),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("rendezvous {}", dir.display()))?;
    let config = GrpoConfig::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    let advertise = args
        .advertise
        .clone()
        .or_else(|| env("POD_IP"))
        .unwrap_or_else(host_name);
    // Port 0 asks the system for a free port, whatever the local rank.
    let port = match args.port {
        0 => 0,
        base => base
            .checked_add(placement.local_rank as u16)
            .ok_or_else(|| anyhow!("--port {base} + local rank overflows"))?,
    };
    say(format!(
        "stoke launch: {:?} rank {} of {} (local {}) is the {role:?}; rendezvous {}",
        placement.launcher,
        placement.rank,
        placement.world_size,
        placement.local_rank,
        dir.display()
    ));
    match role {
        Role::Trainer => trainer(&args, &dir),
        Role::Rollout(_) => {
            let mut serve = super::serve::engine_config(config.model.clone(), &args.engine)?;
            serve.host = args.host.clone();
            serve.port = port;
            serve.served_model_name = Some(SERVED_NAME.into());
            let server = RunningServer::start(serve).map_err(anyhow::Error::msg)?;
            serve_until_done(&dir, role, &advertise, server.addr.port())?;
            server.stop();
            Ok(())
        }
        Role::Reward(_) => {
            let rewards = super::grpo::build_rewards(&config)?;
            let server = RunningRewardServer::start(
                RewardServerConfig {
                    host: args.host.clone(),
                    port,
                    rewards,
                    workers: config.settings.reward_workers,
                    timeout: config.settings.reward_timeout,
                    isolation: stoke_sandbox::probe().level.name().to_string(),
                },
                false,
            )
            .map_err(anyhow::Error::msg)?;
            serve_until_done(&dir, role, &advertise, server.addr.port())?;
            server.stop();
            Ok(())
        }
    }
}

/// The model name the launched rollout servers serve and the trainer expects.
const SERVED_NAME: &str = "policy";

fn serve_until_done(dir: &Path, role: Role, advertise: &str, port: u16) -> anyhow::Result<()> {
    let url = format!("http://{advertise}:{port}");
    write_atomically(&url_file(dir, role), &url)?;
    say(format!(
        "stoke launch: {role:?} serving at {url}; stops when the trainer writes {}",
        dir.join("done").display()
    ));
    while !dir.join("done").exists() {
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Waits for `count` servers of `role` and returns their URLs.
fn wait_for(
    dir: &Path,
    count: usize,
    role: fn(usize) -> Role,
    deadline: Instant,
) -> anyhow::Result<Vec<String>> {
    let mut urls = Vec::with_capacity(count);
    for i in 0..count {
        let file = url_file(dir, role(i));
        let url = loop {
            if let Ok(url) = std::fs::read_to_string(&file) {
                let client = stoke_serve::client::Client::with_timeout(
                    url.trim(),
                    Some(Duration::from_secs(5)),
                );
                if matches!(client.get_text("/health"), Ok((200, _))) {
                    break url.trim().to_string();
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{:?} did not come up: no answering URL in {}",
                    role(i),
                    file.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        urls.push(url);
    }
    Ok(urls)
}

fn trainer(args: &LaunchArgs, dir: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(dir.join("done"));
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    let result = (|| {
        let rollout = wait_for(dir, args.rollout_servers, Role::Rollout, deadline)?;
        let reward = wait_for(dir, args.reward_servers, Role::Reward, deadline)?;
        let quoted = |urls: &[String]| {
            urls.iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut sets = args.sets.clone();
        if !rollout.is_empty() {
            sets.push("rollout.kind=\"remote\"".into());
            sets.push(format!("rollout.servers=[{}]", quoted(&rollout)));
            sets.push(format!("rollout.model=\"{SERVED_NAME}\""));
        }
        if !reward.is_empty() {
            sets.push("reward.kind=\"remote\"".into());
            sets.push(format!("reward.servers=[{}]", quoted(&reward)));
        }
        super::grpo::run_with(&args.config, sets, args.resume, args.quiet)
    })();
    let status = if result.is_ok() { "ok" } else { "failed" };
    write_atomically(&dir.join("done"), status)?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn placement(vars: &[(&str, &str)]) -> anyhow::Result<Placement> {
        let map: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Placement::from_env(&|key| map.get(key).cloned())
    }

    #[test]
    fn each_launcher_is_read() {
        let torch = placement(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "h"),
        ])
        .unwrap();
        assert_eq!(
            (
                torch.launcher,
                torch.rank,
                torch.world_size,
                torch.local_rank
            ),
            (Launcher::Torchrun, 2, 4, 1)
        );
        let slurm = placement(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_ID", "77"),
        ])
        .unwrap();
        assert_eq!(
            (slurm.launcher, slurm.rank, slurm.job.as_deref()),
            (Launcher::Slurm, 3, Some("77"))
        );
        let ompi = placement(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(
            (ompi.launcher, ompi.rank),
            (Launcher::OpenMpi, 1),
            "mpirun inside an allocation numbers the process"
        );
        let mpich = placement(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "0"),
        ])
        .unwrap();
        assert_eq!(mpich.launcher, Launcher::Mpich);
        let jobset = placement(&[
            ("REPLICATED_JOB_NAME", "rollout"),
            ("JOB_COMPLETION_INDEX", "1"),
            ("JOBSET_NAME", "grpo"),
        ])
        .unwrap();
        assert_eq!(jobset.role(2, 1).unwrap(), Role::Rollout(1));
        assert_eq!(jobset.job.as_deref(), Some("grpo"));
        assert_eq!(placement(&[]).unwrap().launcher, Launcher::Single);
    }

    #[test]
    fn ranks_map_to_roles_and_bad_worlds_are_refused() {
        let at = |rank: usize| Placement {
            launcher: Launcher::Torchrun,
            rank,
            world_size: 4,
            local_rank: 0,
            role_name: None,
            job: None,
        };
        let roles: Vec<Role> = (0..4).map(|r| at(r).role(2, 1).unwrap()).collect();
        assert_eq!(
            roles,
            [
                Role::Trainer,
                Role::Rollout(0),
                Role::Rollout(1),
                Role::Reward(0)
            ]
        );
        let error = at(0).role(2, 2).unwrap_err().to_string();
        assert!(
            error.contains("started 4 processes") && error.contains("need 5"),
            "{error}"
        );
        let error = placement(&[("RANK", "4"), ("WORLD_SIZE", "4")])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("RANK=4 is not below WORLD_SIZE=4"),
            "{error}"
        );
        let error = placement(&[("RANK", "x"), ("WORLD_SIZE", "4")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("RANK=\"x\""), "{error}");
        let jobset = placement(&[
            ("REPLICATED_JOB_NAME", "workers"),
            ("JOB_COMPLETION_INDEX", "0"),
        ])
        .unwrap();
        assert!(
            jobset
                .role(1, 1)
                .unwrap_err()
                .to_string()
                .contains("trainer, rollout and reward")
        );
        let past = placement(&[
            ("REPLICATED_JOB_NAME", "reward"),
            ("JOB_COMPLETION_INDEX", "1"),
        ])
        .unwrap();
        assert!(
            past.role(1, 1)
                .unwrap_err()
                .to_string()
                .contains("past --reward-servers")
        );
    }
}
