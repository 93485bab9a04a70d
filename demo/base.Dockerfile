# Demo base image: stands in for a vendor base such as nvcr.io/nvidia/pytorch.
# Built by builder/baseimage.py with network none. The context holds only this file,
# requirements.lock (every wheel pinned with --hash=sha256:...) and wheels/ (downloaded on the host).
# ROOTFS is the `docker import`ed debootstrap (minbase bookworm) rootfs, already in the engine.
ARG ROOTFS

# Stage 1: the venv, installed offline; the wheelhouse never reaches the final image.
FROM ${ROOTFS} AS venv
COPY requirements.lock /tmp/requirements.lock
COPY wheels/ /wheels/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --no-index --require-hashes -r /tmp/requirements.lock --find-links /wheels \
 && /opt/venv/bin/python -m pip check \
 && /opt/venv/bin/python -c "import torch, setuptools, wheel; print('torch', torch.__version__)" \
 && rm -rf /wheels /tmp/requirements.lock

# Stage 2: rootfs + venv only.
FROM ${ROOTFS}
COPY --from=venv /opt/venv /opt/venv
ENV LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
CMD ["/bin/bash"]
