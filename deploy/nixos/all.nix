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
flake:
{ config, lib, ... }:
let
  services = flake.lib.services;
  dir = config.services.llmgw.credentialsDirectory;
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
    systemd.services = lib.mkIf config.services.nats.enable (
      lib.genAttrs (map (name: "llmgw-${name}") services) (_: {
        after = [ "nats.service" ];
        wants = [ "nats.service" ];
      })
    );
  };
}
