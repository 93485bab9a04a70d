"""verl's console and file loggers: `step:N - key:value` lines and JSONL `{"step": N, "data": {...}}`."""
import json
import numbers
import os
import pprint


def concat_dict_to_str(data: dict, step) -> str:
    out = [f"step:{step}"]
    for key, value in data.items():
        if isinstance(value, numbers.Number):
            out.append(f"{key}:{pprint.pformat(value)}")
        elif isinstance(value, str):
            out.append(f"{key}:{value}")
    return " - ".join(out)


class Tracking:
    def __init__(self, project_name: str, experiment_name: str, backends):
        self.console = "console" in backends
        self.fp = None
        if "file" in backends:
            path = os.environ.get("VERL_FILE_LOGGER_PATH")
            if not path:
                root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "metrics"))
                path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.fp = open(path, "a")

    def log(self, data: dict, step: int):
        if self.console:
            print(concat_dict_to_str(data, step), flush=True)
        if self.fp:
            self.fp.write(json.dumps({"step": step, "data": data}) + "\n")
            self.fp.flush()

    def close(self):
        if self.fp:
            self.fp.close()
