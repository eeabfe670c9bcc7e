# Every llmgw service on one machine, beside the NATS server NixOS provides.
flake:
{ lib, ... }:
{
  imports = map (name: import ./service.nix name flake) [ "catalog" "scheduler" "mirror" "router" "agent" ];
  services.nats = { enable = lib.mkDefault true; jetstream = true; };
  services.llmgw = lib.genAttrs [ "catalog" "scheduler" "mirror" "router" "agent" ] (_: { enable = lib.mkDefault true; });
}
