"""The docs site (``mkdocs.yml`` over ``docs/``) builds in strict mode, and strict mode does fail on
a broken link and on a missing page; the nav has a page for every topic a user looks for and for
every backend, engine and algorithm the repository's plugins register; the API reference renders
the plugin contracts from their docstrings; the configuration reference (``docs/reference/config.md``)
is what the config models give today, documents every key the examples use and every key
``rlweave validate`` accepts."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs")


def _build(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built once from the repository, in strict mode."""
    out = tmp_path_factory.mktemp("docs") / "site"
    done = _build(REPO, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_docs_build_in_strict_mode_and_broken_links_or_missing_pages_fail_them(site, tmp_path):
    assert (site / "reference" / "config" / "index.html").is_file()

    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("core", "scripts"):  # the API reference reads core/src, its griffe extension is in scripts/
        (copy / part).symlink_to(REPO / part)
    shutil.copytree(REPO / "docs", copy / "docs")
    page = copy / "docs" / "reliability.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no_such_page.md).\n")
    config = (REPO / "mkdocs.yml").read_text()
    assert "\n  - Writing a plugin: writing_a_plugin.md\n" in config
    (copy / "mkdocs.yml").write_text(config.replace(
        "\n  - Writing a plugin: writing_a_plugin.md\n",
        "\n  - Writing a plugin: writing_a_plugin.md\n  - Missing: no_such_nav_page.md\n"))
    broken = _build(copy, tmp_path / "site2")
    assert broken.returncode != 0
    assert "no_such_page.md" in broken.stdout + broken.stderr
    assert "no_such_nav_page.md" in broken.stdout + broken.stderr


def _nav_pages() -> list[str]:
    def walk(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from walk(value)
            else:
                yield value

    return list(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))


#: what a user looks for -> the page of the nav that answers it
TOPICS = {
    "getting started": "index.md",
    "configuration": "configuration.md",
    "the CLI": "cli.md",
    "LoRA": "lora.md",
    "mixture-of-experts models": "moe.md",
    "sequence parallelism": "sequence_parallel.md",
    "run modes": "async_rollout.md",
    "multi-turn": "multi_turn.md",
    "several nodes": "multi_node.md",
    "GPUs": "gpu.md",
    "writing a plugin": "writing_a_plugin.md",
    "configuration reference": "reference/config.md",
    "API reference: plugin hooks and records": "reference/api/plugins.md",
    "API reference: contracts": "reference/api/interfaces.md",
    "API reference: algorithm parts": "reference/api/algo_parts.md",
}


def test_the_nav_has_a_page_for_every_topic():
    pages = _nav_pages()
    missing = {topic: page for topic, page in TOPICS.items()
               if page not in pages or not (REPO / "docs" / page).is_file()}
    assert not missing, missing


def _repo_records():
    """Every record the repository's own distributions register (core and ``plugins/*``)."""
    from rlweave.plugins.manager import get_plugin_manager

    ours = {"rlweave"} | {re.search(r'^name = "([^"]+)"', p.read_text(), re.MULTILINE).group(1)
                          for p in (REPO / "plugins").glob("*/pyproject.toml")}
    pm = get_plugin_manager()
    loaded = {p.plugin.distribution for p in pm.providers()}
    assert ours <= loaded, f"not installed (make setup): {sorted(ours - loaded)}"
    return [p.record for p in pm.providers() if p.plugin.distribution in ours]


def test_every_backend_engine_and_algorithm_of_the_plugins_has_a_page():
    records = _repo_records()
    pages = _nav_pages()
    kinds = {r.kind for r in records}
    assert {"backend", "engine", "algorithm"} <= kinds
    missing = [f"{r.kind} {r.name}: {folder}/{r.name}.md" for r in records
               for kind, folder in (("backend", "backends"), ("engine", "engines")) if r.kind == kind
               and f"{folder}/{r.name}.md" not in pages]
    family_headings = {page: [line for line in (REPO / "docs" / page).read_text().splitlines() if line.startswith("#")]
                       for page in pages if page.startswith("algorithms/")}
    assert len(family_headings) >= 3
    for r in records:
        if r.kind == "algorithm" and not any(f"`{r.name}`" in h for hs in family_headings.values() for h in hs):
            missing.append(f"algorithm {r.name}: a heading naming `{r.name}` on a page under docs/algorithms/")
    assert not missing, missing


def test_the_api_reference_renders_every_hook_record_and_contract(site):
    from rlweave.plugins.hookspecs import HOOK_KINDS
    from rlweave.plugins.types import RECORD_TYPES

    html = "".join(p.read_text() for p in (site / "reference" / "api").rglob("index.html"))
    ids = set(re.findall(r'id="(rlweave\.[\w.]+)"', html))
    wanted = {f"rlweave.plugins.hookspecs.{hook}" for hook in HOOK_KINDS}
    wanted |= {f"rlweave.plugins.types.{cls.__name__}" for cls in RECORD_TYPES.values()}
    wanted |= {"rlweave.interfaces.backend.TrainingWorker", "rlweave.interfaces.engine.RolloutEngine",
               "rlweave.interfaces.algorithm.Algorithm", "rlweave.interfaces.environment.Environment",
               "rlweave.interfaces.rollout.Rollout", "rlweave.interfaces.pipeline.Pipeline",
               "rlweave.interfaces.worker.WorkerContext", "rlweave.algo_parts.spec.PartSpec",
               "rlweave.testing.backend_contract.BackendContractSuite",
               "rlweave.testing.engine_contract.EngineContractSuite"}
    assert not wanted - ids, sorted(wanted - ids)
    assert ":class:`" not in html and ":mod:`" not in html  # Sphinx roles became links or code


def _reference():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_configuration_reference_is_up_to_date():
    mod = _reference()
    assert mod.PAGE.read_text() == mod.render(), "run python scripts/config_reference.py"


def _keys(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{prefix}{k}"
            yield from _keys(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict):
                yield from _keys(v, f"{prefix[:-1]}[{i}].")


def test_every_key_the_examples_use_is_in_the_reference():
    rows = [line.split("|")[1:3] for line in _reference().PAGE.read_text().splitlines() if line.startswith("| `")]
    documented = {key.strip().strip("`"): typ.strip() for key, typ in rows}
    patterns = [(re.compile("^" + re.escape(k).replace(re.escape("<name>"), r"[^.\[]+")
                            .replace(re.escape("<kernel>"), r"[^.\[]+").replace(re.escape("[i]"), r"\[\d+\]") + "$"), t)
                for k, t in documented.items()]

    def covered(key: str) -> bool:
        parts = key.split(".")
        for n in range(len(parts), 0, -1):  # the key, or a free-form mapping above it
            head = ".".join(parts[:n])
            for pattern, typ in patterns:
                if pattern.match(head) and (n == len(parts) or "dict[" in typ):  # below: free names
                    return True
        return False

    configs = sorted(p for p in (REPO / "examples").rglob("*.yaml") if "artifacts" not in p.parts)
    assert len(configs) >= 10
    missing = {}
    for path in configs:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "roles" not in data and "algorithm" not in data:
            continue
        user_algorithm = ":" in str((data.get("algorithm") or {}).get("name", ""))
        for key in _keys(data):
            if user_algorithm and key.startswith("algorithm."):
                continue  # a user's own algorithm class validates its own section (docs/custom_algorithm.md)
            if not covered(key):
                missing.setdefault(key, str(path.relative_to(REPO)))
    assert not missing, json.dumps(missing, indent=1)


def _documented() -> dict:
    """The reference page's keys by section: ``"core"`` for the run config, ``(kind, name)`` for
    a plugin's own section."""
    sections: dict = {"core": set()}
    current: object = "core"
    for line in _reference().PAGE.read_text().splitlines():
        heading = re.match(r"## (\w+): `([^`]+)`", line)
        if heading:
            current = (heading.group(1), heading.group(2))
            sections.setdefault(current, set())
        elif line.startswith("| `"):
            sections[current].add(line.split("|")[1].strip().strip("`"))
    return sections


def _template(path: str) -> str:
    """A concrete dotted path as the reference writes it: ``roles.policy.options`` ->
    ``roles.<name>.options``, ``resources.pools.default`` -> ``resources.pools.<name>``,
    ``rewards.0.args`` -> ``rewards[i].args``."""
    parts = path.split(".")
    if parts[0] == "roles" and len(parts) > 1:
        parts[1] = "<name>"
    if parts[:2] == ["resources", "pools"] and len(parts) > 2:
        parts[2] = "<name>"
    out: list[str] = []
    for part in parts:
        if part.isdigit():
            out[-1] += "[i]"
        else:
            out.append(part)
    return ".".join(out)


def _concrete(template: str, names: dict) -> list[str]:
    """The paths of a config that ``template`` stands for: ``roles.<name>.optim`` ->
    ``roles.policy.optim``, ``roles.rollout.optim``; ``rewards[i]`` -> ``rewards.0``, ..."""
    out = [template]
    for holder, values in names.items():
        head = holder.split(".<")[0].split("[")[0]
        out = [p.replace(holder, f"{head}.{v}", 1) for p in out for v in values] if holder in template else out
    return out


PLANTED = "qqqqqqqqqqqqqqqq"  # no key is close to it, so validation lists the allowed keys


def test_the_reference_lists_every_key_validate_accepts():
    """Plant an unknown key in every section of every example config (each role, pool, reward,
    the algorithm's and each plugin's own section): ``rlweave validate`` refuses it and lists the
    keys it accepts there, and each of those is in the reference, in that section."""
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    documented = _documented()
    core = documented["core"]
    sections = sorted(k for k in core  # keys with keys below them (not a mapping of named sections)
                      if any(o.startswith(k + ".") and not o.startswith(k + ".<name>") for o in core))
    allowed_re = re.compile(r"^unknown key \(allowed: (.*)\)$")
    missing, planted_total = {}, 0
    configs = sorted(p for p in (REPO / "examples").rglob("*.yaml") if "artifacts" not in p.parts)
    for path in configs:
        data = yaml.safe_load(path.read_text())
        algorithm = (data.get("algorithm") or {}).get("name", "grpo") if isinstance(data, dict) else ""
        if not isinstance(data, dict) or "roles" not in data or ":" in str(algorithm):
            continue  # not a run config, or a user's own algorithm class (its own section)
        roles = data["roles"]
        pools = ((data.get("resources") or {}).get("pools") or {"default": {}})
        rewards = data.get("rewards") or []

        names = {"roles.<name>": list(roles), "resources.pools.<name>": list(pools), "rewards[i]": range(len(rewards))}
        core_plants = [f"{p}.{PLANTED}" for s in sections for p in _concrete(s, names)]
        plugin_plants = [f"algorithm.{PLANTED}"] + [f"roles.{r}.options.{PLANTED}" for r in roles]
        plugin_plants += [f"rewards.{i}.args.{PLANTED}" for i, rw in enumerate(rewards)
                          if ("reward", rw.get("name")) in documented]
        env = ((data.get("algorithm") or {}).get("multi_turn") or {}).get("env") or {}
        if ("environment", env.get("name")) in documented:
            plugin_plants.append(f"algorithm.multi_turn.env.args.{PLANTED}")
        for plants in (core_plants, plugin_plants):
            with pytest.raises(ConfigError) as err:
                load_config(path, [f"{p}=1" for p in plants], check_inputs=False)
            found = {i.path: allowed_re.match(i.message) for i in err.value.issues if i.path in plants}
            assert set(found) == set(plants) and all(found.values()), (path, err.value.issues)
            planted_total += len(plants)
            for planted, match in found.items():
                where = planted[: -len(PLANTED) - 1]
                key = _template(where)
                if where.startswith("roles.") and where.endswith(".options"):
                    role = roles[where.split(".")[1]]
                    plugin = ("backend", role["backend"]) if role.get("backend") else ("engine", role["engine"])
                    places = [documented[plugin]]
                elif where.startswith("rewards.") and where.endswith(".args"):
                    places = [documented[("reward", rewards[int(where.split(".")[1])]["name"])]]
                elif where.startswith("algorithm.multi_turn.env.args"):
                    places = [documented[("environment", env["name"])]]
                elif where == "algorithm":
                    places = [documented[("algorithm", algorithm)], core]
                else:
                    places = [core]
                for name in match.group(1).split(", "):
                    if not any(f"{key}.{name}" in place for place in places):
                        missing.setdefault(f"{key}.{name}", str(path.relative_to(REPO)))
    assert planted_total > 200
    assert not missing, json.dumps(missing, indent=1)


def test_every_key_of_every_plugin_model_is_in_the_reference():
    """The same from the config models directly (``rlweave.testing.config_keys``, an independent
    walk), for the plugins no example selects too; a reward without an options model takes any
    ``args``, which the reference lists as a mapping."""
    from rlweave.plugins.manager import get_plugin_manager
    from rlweave.testing.config_keys import key_universe

    documented = _documented()
    pm = get_plugin_manager()
    universe = key_universe(pm)
    modelled = {(p.kind, p.name) for p in pm.providers() if p.record.config_model is not None}
    missing = []
    for key in list(universe.keys) + list(universe.unavailable):
        path = re.sub(r"\.<(?:role|pool|key)>", ".<name>", key.path).replace(".<i>", "[i]")
        if key.plugin is None:
            ok = path in documented["core"]
        elif path.startswith("rewards[i].args."):
            ok = (path in documented.get(("reward", key.plugin), ())
                  or ("reward", key.plugin) not in modelled and "rewards[i].args" in documented["core"])
        else:
            kinds = ("algorithm",) if path.startswith("algorithm.") else ("backend", "engine")
            ok = any(path in documented.get((kind, key.plugin), ()) for kind in kinds)
        if not ok:
            missing.append(str(key))
    assert len(universe.keys) > 200
    assert not missing, missing
