//! `raypipe dev`: a local control plane with raypipe's CRDs and controllers.

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {}

pub async fn run(_args: DevArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
