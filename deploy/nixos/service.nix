# One llmgw service as a systemd unit: `services.llmgw.<name>.enable = true;`
name: flake:
{ config, lib, pkgs, ... }:
let
  cfg = config.services.llmgw.${name};
  toml = pkgs.formats.toml { };
in
{
  options.services.llmgw.${name} = {
    enable = lib.mkEnableOption "the llmgw ${name} service";
    package = lib.mkOption {
      type = lib.types.package;
      default = flake.packages.${pkgs.system}.llmgw;
      description = "The llmgw package.";
    };
    natsUrl = lib.mkOption {
      type = lib.types.str;
      default = "nats://127.0.0.1:4222";
      description = "NATS servers, comma-separated (a JetStream cluster in production).";
    };
    settings = lib.mkOption {
      type = toml.type;
      default = { };
      description = "Fields of the service's config Struct, written to its TOML config file.";
    };
  };

  config = lib.mkIf cfg.enable {
    systemd.services."llmgw-${name}" = {
      description = "llmgw ${name}";
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      environment.LLMGW_HOME = "/var/lib/llmgw";
      serviceConfig = {
        ExecStart = "${cfg.package}/bin/llmgw service ${name} --nats-url ${cfg.natsUrl} --config ${toml.generate "llmgw-${name}.toml" cfg.settings}";
        DynamicUser = true;
        StateDirectory = "llmgw";
        Restart = "always";
        RestartSec = 2;
        KillMode = "control-group"; # engines the agent started stop with it
        TimeoutStopSec = 30;
      };
    };
  };
}
