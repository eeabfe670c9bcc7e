# Every llmgw service on one machine, beside the NATS server NixOS provides.
#
# Each service is its own unit, user and state directory (see service.nix). With
# `services.llmgw.credentialsDirectory = "/etc/llmgw/creds";` each reaches NATS with the nkey
# seed file in that directory named after its role: catalog.nk, scheduler.nk, mirror.nk,
# router.nk, and agent.nk, this node's agent identity (the one `llmgw up` names agent-<node>.nk);
# root's, 0600, never in the Nix store; the router and the agent also read engine.secret there
# (`llmgw access write` makes engine-fleet.secret for the router, engine-<node>.secret per node),
# and the agent scheduler.pub, the scheduler's public key (it acts only on starts and stops the
# scheduler signed). One service's file can still be set apart: services.llmgw.<name>.credentialsFile.
#
# `services.llmgw.prometheus.enable = true;` has this machine's Prometheus scrape every llmgw
# service enabled here (labelled with its service and host) and load llmgw's alert rules;
# `services.llmgw.otlpEndpoint = "http://tempo:4318";` exports every service's traces over OTLP.
flake:
{ config, lib, ... }:
let
  services = flake.lib.services;
  dir = config.services.llmgw.credentialsDirectory;
  otlp = config.services.llmgw.otlpEndpoint or null;
  # Each service's admin port (/metrics), as llmgw.bus.ADMIN_PORTS gives them.
  adminPorts = { catalog = 9461; scheduler = 9462; mirror = 9463; router = 9464; agent = 9465; };
  enabled = builtins.filter (name: config.services.llmgw.${name}.enable or true) services;
in
{
  key = "llmgw/deploy/nixos/all.nix";
  imports = map (name: import ./service.nix name flake) services;

  options.services.llmgw.credentialsDirectory = lib.mkOption {
    type = lib.types.nullOr (lib.types.strMatching "/.+");
    default = null;
    example = "/etc/llmgw/creds";
    description = "Where each service's NATS credentials are, as <name>.nk (outside the Nix store).";
  };
  options.services.llmgw.prometheus.enable = lib.mkEnableOption "scraping llmgw's services and its alert rules";
  options.services.llmgw.otlpEndpoint = lib.mkOption {
    type = lib.types.nullOr lib.types.str;
    default = null;
    example = "http://tempo.internal:4318";
    description = "Where every service sends its traces (OTEL_EXPORTER_OTLP_ENDPOINT, OTLP/HTTP); null: none.";
  };

  config = {
    services.nats = { enable = lib.mkDefault true; jetstream = lib.mkDefault true; };
    services.llmgw = lib.genAttrs services (name: {
      enable = lib.mkDefault true;
      credentialsFile = lib.mkIf (dir != null) (lib.mkDefault "${dir}/${name}.nk");
    } // lib.optionalAttrs (name == "router" || name == "agent") {
      # engine-fleet.secret (router) or this node's engine-<node>.secret (agent), as engine.secret
      engineSecretFile = lib.mkIf (dir != null) (lib.mkDefault "${dir}/engine.secret");
    } // lib.optionalAttrs (name == "agent") {
      schedulerKeyFile = lib.mkIf (dir != null) (lib.mkDefault "${dir}/scheduler.pub");
    });
    systemd.services = lib.genAttrs (map (name: "llmgw-${name}") services) (_:
      lib.optionalAttrs config.services.nats.enable { after = [ "nats.service" ]; wants = [ "nats.service" ]; }
      // lib.optionalAttrs (otlp != null) { environment.OTEL_EXPORTER_OTLP_ENDPOINT = otlp; });
    services.prometheus = lib.mkIf (config.services.llmgw.prometheus.enable or false) {
      scrapeConfigs = [{
        job_name = "llmgw";
        scrape_interval = "15s";
        static_configs = map (name: {
          targets = [ "127.0.0.1:${toString adminPorts.${name}}" ];
          labels = { service = name; host = config.networking.hostName; };
        }) enabled;
      }];
      ruleFiles = [ ../prometheus/llmgw-rules.yml ];
    };
  };
}
