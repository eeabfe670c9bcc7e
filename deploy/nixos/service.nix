# One llmgw service as a systemd unit: `services.llmgw.<name>.enable = true;`
#
# Each service runs as its own system user, llmgw-<name>, keeps its files in its own state
# directory, /var/lib/llmgw-<name> (0700), and reaches NATS with its own credentials: the nkey
# seed file named by `credentialsFile` stays root's (0600, outside the Nix store); systemd hands
# a copy to this unit alone (LoadCredential=) and the service reads it from its credentials
# directory (`--creds %d/nats.nk`). Static users rather than DynamicUser: the agent's and the
# mirror's weights (hundreds of GB) keep one owner across restarts.
name: flake:
{ config, lib, pkgs, utils, ... }:
let
  cfg = config.services.llmgw.${name};
  unit = "llmgw-${name}";
  home = "/var/lib/${unit}";
  toml = pkgs.formats.toml { };
  # The agent runs llama.cpp from `llamaCpp`; nixpkgs names its RPC worker llama-rpc-server.
  defaults = lib.optionalAttrs (name == "agent") {
    llama_server = "${cfg.llamaCpp}/bin/llama-server";
    rpc_server = "${cfg.llamaCpp}/bin/llama-rpc-server";
  };
  command = [ (lib.getExe' cfg.package "llmgw") "service" name "--nats-url" cfg.natsUrl "--config" cfg.configFile ]
    ++ lib.optionals (cfg.tlsCaFile != null) [ "--tls-ca" cfg.tlsCaFile ];
in
{
  key = "llmgw/deploy/nixos/service.nix#${name}"; # imported by all.nix and alone: declared once
  options.services.llmgw.${name} = {
    enable = lib.mkEnableOption "the llmgw ${name} service";
    package = lib.mkOption {
      type = lib.types.package;
      default = flake.packages.${pkgs.stdenv.hostPlatform.system}.llmgw;
      defaultText = lib.literalExpression "llmgw.packages.\${pkgs.stdenv.hostPlatform.system}.llmgw";
      description = "The llmgw package (its bin/llmgw runs the service).";
    };
    natsUrl = lib.mkOption {
      type = lib.types.str;
      default = "nats://127.0.0.1:4222";
      description = "NATS servers, comma-separated (a JetStream cluster in production; tls:// with TLS).";
    };
    credentialsFile = lib.mkOption {
      # A string, not a path: a path would be copied into the world-readable Nix store.
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/etc/llmgw/creds/${name}.nk";
      description = ''
        This service's NATS credentials, an nkey seed file (an absolute path outside the Nix
        store, root's, 0600), passed to it as `--creds` through systemd's LoadCredential=.
        Null: connect without (a NATS server with authorization refuses that).
      '';
    };
    engineSecretFile = lib.mkOption {
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/etc/llmgw/creds/engine.secret";
      description = ''
        The router's and the agent's engine secret (engine-fleet.secret for the router, this node's
        engine-<node>.secret for the agent, from `llmgw access write`): engines' keys are worked out
        from it. Passed as `--engine-secret` through LoadCredential=, like the NATS credentials.
      '';
    };
    hubTokenFile = lib.mkOption {
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/etc/llmgw/creds/hf.token";
      description = ''
        The mirror's Hugging Face token (for gated and private repos), a file outside the Nix
        store; passed as `--token-file` through LoadCredential=. Null: HF_TOKEN, else no token.
        Only the mirror reads it.
      '';
    };
    tlsCaFile = lib.mkOption {
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/etc/llmgw/tls/ca.pem";
      description = "The CA the NATS servers' certificates are checked against (`--tls-ca`). Null: plain TCP.";
    };
    settings = lib.mkOption {
      type = toml.type;
      default = { };
      description = ''
        Fields of the service's config Struct, written to its TOML config file. It lands in the
        Nix store, readable by all: secrets go in credentials, never here.
      '';
    };
    extraFlags = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      default = [ ];
      example = [ "--log-level" "debug" ];
      description = "More `--field value` flags after the command line (flags win over settings).";
    };
    configFile = lib.mkOption {
      type = lib.types.path;
      internal = true;
      readOnly = true;
      default = toml.generate "${unit}.toml" (defaults // cfg.settings);
      defaultText = "the TOML file written from settings";
      description = "The config file the unit runs with.";
    };
  } // lib.optionalAttrs (name == "agent") {
    schedulerKeyFile = lib.mkOption {
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/etc/llmgw/creds/scheduler.pub";
      description = ''
        The scheduler's public key (scheduler.pub from `llmgw access write`): the agent starts and
        stops engines only on requests the scheduler signed. Passed as `--scheduler-key` through
        LoadCredential=. Needed with credentialsFile (the agent refuses to start without it); it is
        public, so `settings.scheduler_key = "U..."` does as well.
      '';
    };
    llamaCpp = lib.mkOption {
      type = lib.types.package;
      default = pkgs.llama-cpp.override { rpcSupport = true; };
      defaultText = lib.literalExpression "pkgs.llama-cpp.override { rpcSupport = true; }";
      description = ''
        llama.cpp with its RPC worker, from this system's nixpkgs (so `nixpkgs.config.cudaSupport`
        gives it CUDA); sets the agent's llama_server and rpc_server unless settings do.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    users.users.${unit} = {
      isSystemUser = true;
      group = unit;
      inherit home;
      description = "llmgw ${name}";
      extraGroups = lib.optionals (name == "agent") [ "video" "render" ]; # GPUs' device nodes
    };
    users.groups.${unit} = { };

    systemd.services.${unit} = {
      description = "llmgw ${name}";
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      environment.LLMGW_HOME = home;
      serviceConfig = {
        # %d is the unit's credentials directory: left unescaped, systemd expands it.
        ExecStart = lib.concatStringsSep " " (
          [ (utils.escapeSystemdExecArgs command) ]
          ++ lib.optional (cfg.credentialsFile != null) "--creds %d/nats.nk"
          ++ lib.optional (cfg.engineSecretFile != null) "--engine-secret %d/engine.secret"
          ++ lib.optional (cfg.hubTokenFile != null) "--token-file %d/hf.token"
          ++ lib.optional (cfg.schedulerKeyFile or null != null) "--scheduler-key %d/scheduler.pub"
          ++ lib.optional (cfg.extraFlags != [ ]) (utils.escapeSystemdExecArgs cfg.extraFlags)
        );
        User = unit;
        Group = unit;
        StateDirectory = unit;
        StateDirectoryMode = "0700";
        WorkingDirectory = home;
        Restart = "always";
        RestartSec = 2;
        RestartPreventExitStatus = 2; # wrong config or credentials: said once, not every 2 s
        # A stopping agent stops its engines itself; one that crashes leaves them serving, and the
        # restarted agent adopts them (systemd must not kill them with it). Others: everything.
        KillMode = if name == "agent" then "process" else "control-group";
        TimeoutStopSec = 30;
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        LoadCredential =
          lib.optional (cfg.credentialsFile != null) "nats.nk:${cfg.credentialsFile}"
          ++ lib.optional (cfg.engineSecretFile != null) "engine.secret:${cfg.engineSecretFile}"
          ++ lib.optional (cfg.hubTokenFile != null) "hf.token:${cfg.hubTokenFile}"
          ++ lib.optional (cfg.schedulerKeyFile or null != null) "scheduler.pub:${cfg.schedulerKeyFile}";
      };
    };
  };
}
