# Base for the real vLLM CPU build: the demo base's recipe (demo/base.Dockerfile) on an Ubuntu 22.04
# rootfs with Python 3.11 and g++ 12.3 (benchmarks/real_vllm_base.py says why). Network none.
ARG ROOTFS

FROM ${ROOTFS} AS venv
COPY requirements.lock /tmp/requirements.lock
COPY wheels/ /wheels/
RUN python3.11 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --no-index --require-hashes -r /tmp/requirements.lock --find-links /wheels \
 && /opt/venv/bin/python -m pip check \
 && /opt/venv/bin/python -c "import torch, setuptools, wheel; print('torch', torch.__version__)" \
 && rm -rf /wheels /tmp/requirements.lock

FROM ${ROOTFS}
COPY --from=venv /opt/venv /opt/venv
ENV LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CC=gcc-12 \
    CXX=g++-12 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
CMD ["/bin/bash"]
