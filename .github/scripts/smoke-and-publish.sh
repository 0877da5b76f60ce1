#!/usr/bin/env bash
# On the DGX Spark runner: for each build in $BUILDS (a JSON list), build its image (natively,
# honouring $LOCKED), smoke-test it under every profile its spec lists, recording the verdicts
# in images.lock, and publish it to $REGISTRY only when all of them passed, signed (the key
# pair in $SPARKBUILD_SIGNING_KEY, else keyless). Every build is attempted; the exit status
# is 1 if any failed.
set -uo pipefail

mapfile -t builds < <(python3 -c 'import json, os; print("\n".join(json.loads(os.environ["BUILDS"])))')
failed=()
for build in "${builds[@]}"; do
    echo "::group::$build"
    # shellcheck disable=SC2086  # LOCKED is empty or one flag
    if ! sparkbuild build $LOCKED "$build"; then
        failed+=("$build (build)")
        echo "::endgroup::"
        continue
    fi
    read -r image profiles < <(python3 - "$build" <<'PY'
import sys
from sparkbuild.errors import SparkbuildError
from sparkbuild.lockfile import pinned_image_id
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds

settings = Settings()
try:
    build = load_builds(settings)[sys.argv[1]]
    print(pinned_image_id(settings.lock_file, build.name), ",".join(build.smoke_profiles))
except (SparkbuildError, KeyError) as error:
    sys.exit(f"::error::{sys.argv[1]}: {error}")
PY
    )
    if [[ -z "${image:-}" ]]; then  # the lock pins no image for it (the error says why)
        failed+=("$build (lock)")
        echo "::endgroup::"
        continue
    fi
    passed=1
    # publish requires a passing preflight of this image (the one built here), recorded.
    if ! sparkbuild preflight --in-image --record "$build"; then
        failed+=("$build (preflight)")
        echo "::endgroup::"
        continue
    fi
    IFS=',' read -r -a profile_list <<< "$profiles"
    for profile in "${profile_list[@]}"; do
        if ! sparkbuild smoke --image "$image" --profile "$profile" --record "$build"; then
            passed=0
        fi
    done
    if [[ ${#profile_list[@]} -eq 0 ]]; then
        echo "::warning::$build lists no smoke profiles; not published"
        passed=0
    fi
    if [[ $passed -eq 1 ]]; then
        # Signed with the key pair in SPARKBUILD_SIGNING_KEY, else keyless (docs/verify.md).
        sign=(--keyless)
        if [[ -n "${SPARKBUILD_SIGNING_KEY:-}" ]]; then
            sign=()
        fi
        sparkbuild publish "$build" --registry "$REGISTRY" "${sign[@]}" || failed+=("$build (publish)")
    else
        failed+=("$build (smoke)")
    fi
    echo "::endgroup::"
done
if ((${#failed[@]})); then
    printf '::error::failed: %s\n' "${failed[@]}"
    exit 1
fi
