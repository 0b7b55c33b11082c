"""One asset per stage program, built from the registry: the asset only names its partition
and hands it to the ``curation`` resource; the work is in ``stages/programs/<name>.py``."""


from dagster import AssetDep, AssetExecutionContext, AssetsDefinition, MaterializeResult, asset

from curation_dagster.partitions import by_crawl, partitions_for, split_key
from curation_dagster.resources import CurationResource
from stages.registry import PROGRAMS, Program


def _deps(program: Program) -> list[AssetDep]:
    deps = []
    for name in program.deps:
        same = PROGRAMS[name].level == program.level
        deps.append(AssetDep(name) if same else AssetDep(name, partition_mapping=by_crawl))
    return deps


def build_asset(program: Program) -> AssetsDefinition:
    res = program.resources
    kinds = {"python", "gpu" if res.gpu else "cpu"}

    @asset(
        name=program.name,
        partitions_def=partitions_for(program.level),
        deps=_deps(program),
        group_name=program.group,
        description=program.description,
        kinds=kinds,
        code_version=str(program.params.version),
        owners=["team:curation"],
        tags={"stage": program.stage} if program.stage else None,
        metadata={"level": program.level, "cpu": res.cpu, "memory_gib": res.memory_gib, "gpu": res.gpu},
    )
    def _asset(context: AssetExecutionContext, curation: CurationResource) -> MaterializeResult:
        crawl, source = split_key(context.partition_key, program.level)
        return curation.materialize(context, program.name, crawl, source)

    return _asset


ASSETS: list[AssetsDefinition] = [build_asset(p) for p in PROGRAMS.values()]
