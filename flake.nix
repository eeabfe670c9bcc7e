{
  description = "llmgw: self-hosted LLM serving — catalog, scheduler, mirror, router, agent";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      services = [ "catalog" "scheduler" "mirror" "router" "agent" ];

      # One Python environment holding every workspace member, built from this tree.
      mkLlmgw = pkgs:
        let
          py = pkgs.python3Packages;
          member = pname: dir: extra: py.buildPythonPackage {
            inherit pname;
            version = "0.1.0";
            pyproject = true;
            src = ./. + "/${dir}";
            build-system = [ py.uv-build py.setuptools py.cython ];
            dependencies = extra;
            doCheck = false;
          };
          proto = member "llmgw-proto" "proto" [ py.msgspec ];
          bus = member "llmgw-bus" "libs/bus" [
            proto py.nats-py py.msgspec py.structlog py.opentelemetry-api py.opentelemetry-sdk
            py.prometheus-client py.litestar py.uvicorn py.httptools py.uvloop py.httpx
          ];
          gguf = member "llmgw-gguf" "libs/gguf" [ py.gguf py.httpx py.msgspec py.numpy ];
          membw = member "llmgw-membw" "libs/membw" [ proto py.msgspec ];
          modelplan = member "llmgw-modelplan" "libs/modelplan" [ proto gguf py.msgspec ];
          # llama.cpp with its RPC worker (ggml-rpc-server), for replicas across nodes.
          llama = pkgs.llama-cpp.override { rpcSupport = true; };
          svc = name: extra: member "llmgw-${name}" "services/${name}" ([ proto bus ] ++ extra);
        in
        py.buildPythonApplication {
          pname = "llmgw";
          version = "0.1.0";
          format = "other";
          dontUnpack = true;
          propagatedBuildInputs = [
            (svc "catalog" [ py.pyyaml ]) (svc "scheduler" [ ]) (svc "mirror" [ ]) (svc "router" [ py.aiohttp py.pyzmq ])
            (svc "agent" [ membw modelplan gguf py.psutil py.nvidia-ml-py ])
            (svc "ctl" [ gguf membw modelplan py.pyyaml ])
          ];
          makeWrapperArgs = [ "--prefix PATH : ${pkgs.lib.makeBinPath [ pkgs.nats-server llama ]}" ];
          installPhase = ''
            mkdir -p $out/bin
            makeWrapper ${pkgs.python3.interpreter} $out/bin/llmgw --add-flags "-m llmgw.ctl" $makeWrapperArgs
          '';
        };
    in
    {
      packages = forAll (pkgs:
        let llmgw = mkLlmgw pkgs; in
        { default = llmgw; inherit llmgw; }
        // nixpkgs.lib.genAttrs services (name: pkgs.writeShellScriptBin "llmgw-${name}" ''
          exec ${llmgw}/bin/llmgw service ${name} "$@"
        ''));

      apps = forAll (pkgs:
        { default = { type = "app"; program = "${self.packages.${pkgs.system}.llmgw}/bin/llmgw"; }; }
        // nixpkgs.lib.genAttrs services (name: {
          type = "app";
          program = "${self.packages.${pkgs.system}.${name}}/bin/llmgw-${name}";
        }));

      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [ pkgs.python3 pkgs.uv pkgs.just pkgs.nats-server pkgs.llama-cpp pkgs.gcc pkgs.ruff ];
          shellHook = "export UV_PROJECT_ENVIRONMENT=.venv";
        };
      });

      checks = forAll (pkgs: {
        unit = pkgs.runCommand "llmgw-unit-tests" {
          nativeBuildInputs = [ (pkgs.python3.withPackages (p: [ p.pytest p.pytest-asyncio p.hypothesis ])) pkgs.nats-server ];
        } ''
          cp -r ${./.} src && chmod -R u+w src && cd src
          PYTHONPATH=${self.packages.${pkgs.system}.llmgw}/${pkgs.python3.sitePackages} \
            python -m pytest -q proto libs services/*/tests
          touch $out
        '';
      });

      nixosModules = nixpkgs.lib.genAttrs services (name: import ./deploy/nixos/service.nix name self)
        // { default = import ./deploy/nixos/all.nix self; };
    };
}
