import sys, time, threading
sys.path.insert(0, "tests")
from pathlib import Path
from fakeserver import FakeServerProcess
from test_gen_faults import prompt_file, run_gen, check_exact, MT_BENCH
import tempfile
from eagle3kit.gen.config import ServerSpec
tok = Path('/tmp/tk/tokenizers/qwen3')
d = Path(tempfile.mkdtemp())
p = prompt_file(d, 12, MT_BENCH)
with FakeServerProcess("vllm", tokenizer=str(tok), decode_tps=150, mean_tokens=24) as srv:
    def killer():
        while len([r for r in srv.requests() if r["path"]=="/v1/completions"]) < 6: time.sleep(0.02)
        srv.kill(); print("killed", time.monotonic()); time.sleep(1.5); srv.start(); print("restarted", time.monotonic())
    threading.Thread(target=killer, daemon=True).start()
    t=time.monotonic()
    res = run_gen(p, d/"ds", [ServerSpec(srv.url, 4)], tok, max_attempts=2)
    print(res, time.monotonic()-t)
